"""How many bytes a round moves: the encodings' sizes, padding and chunking, with no
TensorFlow (the plan of a run reads them before any worker starts).

A coded round (int8, int4, int2, int1, topk) cuts its flat vector into one shard per
worker, each of whole chunks of one length with a float32 scale each
(`hvdtrain.rounds.quantize` encodes them). A topk chunk keeps only its largest values
(SparseLoCo's top-k), each an int8 code and its uint8 place in the chunk.
"""

from __future__ import annotations

CHUNK = 1024        # at most this many int8 or int4 values share one scale
# A topk chunk: its places fit a uint8, and it keeps 1/32 of them (3%, within SparseLoCo's
# 1-3% at its 4,096-value chunks); what it drops, error feedback sends later.
TOPK_CHUNK = 256
TOPK_KEEP = 8
# Codes run from -LEVELS to LEVELS: symmetric, so 0 stays exactly 0.
LEVELS = {"int8": 127, "int4": 7, "int2": 1, "int1": 1, "topk": 127}
# Codes packed into each byte (a chunk holds a whole number of bytes of them).
CODES_A_BYTE = {"int4": 2, "int2": 4, "int1": 8}
INT8_LEVELS = LEVELS["int8"]
SCALE_BYTES = 4     # a float32 scale, sent as int8 bytes beside the codes
CODED = tuple(LEVELS)  # the encodings with codes and scales
# The encodings too coarse for BatchNorm's statistics, which they leave to float32: top-k
# may send a moving mean's change without its variance's, int2 and int1 each within a
# factor of 2.
WHOLE_STATISTICS = ("int2", "int1", "topk")
COMPRESSED = ("fp16", *CODED)
# Bytes a value takes in a round of each --round-compression (the scales aside): packed
# codes a byte's share each; a topk chunk's kept values send a code byte and a place byte.
VALUE_BYTES = {"none": 4, "fp16": 2, "int8": 1,
               **{name: 1 / codes for name, codes in CODES_A_BYTE.items()},
               "topk": 2 * TOPK_KEEP / TOPK_CHUNK}


def _ceil_div(a: int, b: int) -> int:
    return -(-a // b)


def chunk_length(values: int, workers: int, compression: str = "int8") -> int:
    """Values per chunk in a coded round of `values` at `workers`: a shard's share of them
    cut into the fewest chunks of at most `CHUNK`, all of one length (a whole number of
    bytes of codes: even for int4, whose bytes hold two, a multiple of 4 for int2, of 8 for
    int1); topk's
    chunks are always `TOPK_CHUNK` long."""
    if compression == "topk":
        return TOPK_CHUNK
    shard = max(1, _ceil_div(values, workers))
    chunk = _ceil_div(shard, _ceil_div(shard, CHUNK))
    per_byte = CODES_A_BYTE.get(compression, 1)
    return _ceil_div(chunk, per_byte) * per_byte


def padded_length(values: int, workers: int, compression: str) -> int:
    """Length of the vector a round encodes: `values` padded with zeros to whole shards,
    one per worker, each of whole chunks of `chunk_length` when coded."""
    shard = max(1, _ceil_div(values, workers))
    if compression in CODED:
        chunk = chunk_length(values, workers, compression)
        shard = _ceil_div(shard, chunk) * chunk
    return workers * shard


def payload_bytes(values: int, workers: int, compression: str) -> int:
    """Bytes one worker hands to a compressed round of `values` float values: its encoded
    vector (codes plus scales, or float16). The alltoall sends (W - 1) / W of it and
    the allgather as much again, 2 (W - 1) / W of it in all: the factor by which a ring
    allreduce's wire bytes exceed its payload, so this counts like an allreduce payload."""
    length = padded_length(values, workers, compression)
    if compression in CODED:
        chunks = length // chunk_length(values, workers, compression)
        return int(length * VALUE_BYTES[compression]) + SCALE_BYTES * chunks
    return VALUE_BYTES[compression] * length

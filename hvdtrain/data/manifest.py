"""manifest.json of a TFRecord folder: records per split and per file, and the class names.

`hvdtrain data to-tfrecords` writes it after its last shard, `hvdtrain data manifest`
for TFRecords made by another tool. With it a reader knows the size of the set
without reading every record before the first step. Plain JSON, no TensorFlow:

    {"format": 1, "classes": ["n01440764", ...] or null,
     "splits": {"train": {"examples": 1281167, "files": {"train-00000-of-01024": 1251, ...}},
                "validation": {...}}}
"""

from __future__ import annotations

import os

from hvdtrain.errors import DataError
from hvdtrain.files import read_json, write_json

MANIFEST = "manifest.json"
FORMAT = 1


def manifest_path(data_dir: str) -> str:
    return os.path.join(data_dir, MANIFEST)


def make_manifest(records: dict[str, dict[str, int]], classes: list[str] | None) -> dict:
    """`records`: for each split, the records in each of its files (by file name)."""
    return {"format": FORMAT, "classes": classes,
            "splits": {split: {"examples": sum(files.values()), "files": dict(sorted(files.items()))}
                       for split, files in records.items()}}


def write_manifest(data_dir: str, records: dict[str, dict[str, int]],
                   classes: list[str] | None) -> str:
    path = manifest_path(data_dir)
    write_json(path, make_manifest(records, classes))
    return path


def read_manifest(data_dir: str) -> dict | None:
    """The folder's manifest, or None when it has none."""
    path = manifest_path(data_dir)
    if not os.path.isfile(path):
        return None
    try:
        manifest = read_json(path)
    except (OSError, ValueError) as exc:
        raise DataError(f"{path}: unreadable manifest ({exc})") from None
    problem = _shape_problem(manifest)
    if problem:
        raise DataError(f"{path}: not an hvdtrain manifest ({problem}); write it again with "
                        f"`hvdtrain data manifest {data_dir}`")
    return manifest


def _shape_problem(manifest) -> str | None:
    if not isinstance(manifest, dict) or manifest.get("format") != FORMAT:
        return f"expected a mapping with \"format\": {FORMAT}"
    classes = manifest.get("classes")
    if classes is not None and not (isinstance(classes, list) and classes):
        return "\"classes\" must be a non-empty list or null"
    splits = manifest.get("splits")
    if not isinstance(splits, dict):
        return "no \"splits\" mapping"
    for split, entry in splits.items():
        files = entry.get("files") if isinstance(entry, dict) else None
        if not isinstance(files, dict) or not all(
                isinstance(n, int) and not isinstance(n, bool) and n >= 0 for n in files.values()):
            return f"split {split!r} needs \"files\": a mapping of file name to record count"
        if entry.get("examples") != sum(files.values()):
            return f"split {split!r}: \"examples\" is not the sum of its files' records"
    return None


def split_examples(manifest: dict, data_dir: str, split: str, files: list[str]) -> int:
    """Records in `split`, once sure the manifest describes exactly these files.

    A manifest left over from an earlier conversion, or files added since, would give
    the wrong epoch length silently; a mismatch is an error instead.
    """
    path = manifest_path(data_dir)
    entry = manifest["splits"].get(split)
    if entry is None:
        raise DataError(f"{path}: no {split!r} split")
    listed, present = set(entry["files"]), {os.path.basename(f) for f in files}
    if listed != present:
        unlisted, missing = sorted(present - listed), sorted(listed - present)
        example = (f"{unlisted[0]} is not listed" if unlisted else f"{missing[0]} is missing")
        raise DataError(f"{path}: lists {len(listed)} {split} files but the folder holds "
                        f"{len(present)} ({example}); write it again with "
                        f"`hvdtrain data manifest {data_dir}`")
    return entry["examples"]

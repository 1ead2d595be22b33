"""How a local or async round travels: in how many fragments, in which compression.

A bench row's bytes per round stand only for rounds of its own form: a round of one of
four fragments sends about a quarter of the state, an int8 round about a quarter of
float32's bytes. `hvdtrain bench` labels its rows with it and `hvdtrain predict` keys
its setups by it, so neither mixes rows of different forms.
"""

from __future__ import annotations

from dataclasses import dataclass

from hvdtrain.config import rounds_compression


@dataclass(frozen=True)
class RoundForm:
    fragments: int = 1         # --round-fragments: a round averages one of this many
    compression: str = "none"  # --round-compression: none, fp16 or int8

    @classmethod
    def of(cls, row: dict) -> "RoundForm":
        """The form of a bench or prediction row (rows from before a column existed
        had its default)."""
        return cls(row.get("round_fragments", 1),
                   # Benches from before --fp16-allreduce's rounds were named fp16 said none.
                   rounds_compression(row.get("round_compression", "none"),
                                      bool(row.get("fp16_allreduce"))))

    def columns(self) -> dict:
        """The form as a row's columns."""
        return {"round_fragments": self.fragments, "round_compression": self.compression}

    @property
    def suffix(self) -> str:
        """What a label adds for it: '', ', 4 fragments', ', int8', ', 4 fragments, int8'."""
        return ((f", {self.fragments} fragments" if self.fragments > 1 else "")
                + (f", {self.compression}" if self.compression != "none" else ""))

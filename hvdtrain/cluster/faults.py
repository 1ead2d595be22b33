"""Host faults at a time or on an event: a NIC goes down or up, a host's processes die, a link slows.

  --fault "at=30s host=h3 action=down"        h3's eth0 goes down (its cable is pulled)
  --fault "at=60s host=h3 action=up"          ...and comes back; sshd restarted if it died
  --fault "at=30s host=h3 action=kill"        every process on h3 is killed (a crash)
  --fault "at=30s host=h3 action=slow:10mbit" h3's link runs at 10 Mbit/s from then on
  --fault "when=run/checkpoints/step-* host=h3 action=kill"
                                              ...once a file matching the pattern exists

Times count from the start of the command. A when= fault fires once, as soon as its
pattern (a path, * and ? allowed) matches a file: an event of the job itself, such as
its first checkpoint, or a file that a test or a user creates. On a loaded machine a
time says little about how far a job has come; an event says exactly that. The hosts
share the file system with the machine, so a file made outside the cluster is seen.
Parsing is pure (but for making when= paths absolute); the supervisor applies them.
"""

from __future__ import annotations

import os
import re
from dataclasses import dataclass

from hvdtrain.errors import ConfigError
from hvdtrain.cluster.links import parse_rate

ACTIONS = ("down", "up", "kill", "slow")
FORMAT = "at=30s|when=PATH host=h3 action=down|up|kill|slow:10mbit"


@dataclass(frozen=True)
class Fault:
    at: float | None    # seconds after the command starts; None for a when= fault
    host: str
    action: str         # one of ACTIONS
    rate_bits: int = 0  # for slow
    when: str = ""      # an absolute path pattern; the fault fires once it matches a file

    def describe(self) -> str:
        what = f"slow to {self.rate_bits / 1e6:g} Mbit/s" if self.action == "slow" else self.action
        return f"{self.host} {what}"

    def trigger(self) -> str:
        return f"once {self.when} exists" if self.when else f"at {self.at:g} s"


def _seconds(text: str, spec: str) -> float:
    match = re.fullmatch(r"(\d+(?:\.\d+)?)(ms|s|m)?", text)
    if not match:
        raise ConfigError(f"--fault at= must be a time like 30s, 500ms or 2m, got {text!r} in {spec!r}")
    scale = {"ms": 0.001, "s": 1.0, "m": 60.0, None: 1.0}[match.group(2)]
    return float(match.group(1)) * scale


def _action(text: str, spec: str) -> tuple[str, int]:
    name, _, arg = text.partition(":")
    if name not in ACTIONS:
        raise ConfigError(f"--fault action must be one of down, up, kill, slow:RATE, got {text!r}")
    if (name == "slow") != bool(arg):
        raise ConfigError(f"--fault action slow takes a rate (slow:10mbit) and the others none, "
                          f"got {text!r} in {spec!r}")
    return name, parse_rate(arg) if arg else 0


def _fields(spec: str) -> dict[str, str]:
    fields = {}
    for word in spec.split():
        key, sep, value = word.partition("=")
        if not sep or key not in ("at", "when", "host", "action") or key in fields or not value:
            raise ConfigError(f"--fault must look like {FORMAT!r}, got {spec!r}")
        fields[key] = value
    if ("at" in fields) == ("when" in fields) or not {"host", "action"} <= set(fields):
        raise ConfigError(f"--fault must give at= or when=, host= and action=, got {spec!r}")
    return fields


def parse_fault(spec: str, host_names: list[str]) -> Fault:
    """'at=30s host=h3 action=slow:10mbit' -> Fault(30.0, 'h3', 'slow', 10_000_000);
    'when=run/x host=h3 action=down' -> Fault(None, 'h3', 'down', 0, '/CWD/run/x')."""
    fields = _fields(spec)
    if fields["host"] not in host_names:
        raise ConfigError(f"--fault names host {fields['host']}, but the cluster has hosts "
                          f"h1..h{len(host_names)}")
    action, rate = _action(fields["action"], spec)
    if "when" in fields:
        # Absolute now: the command on h1 may run in another folder.
        return Fault(None, fields["host"], action, rate, os.path.abspath(fields["when"]))
    return Fault(_seconds(fields["at"], spec), fields["host"], action, rate)


def parse_faults(specs: list[str], host_names: list[str]) -> list[Fault]:
    """Timed faults in time order, so a reader of the log sees them as they happen; then
    the when= faults in the order given."""
    faults = [parse_fault(spec, host_names) for spec in specs]
    return (sorted((f for f in faults if not f.when), key=lambda f: f.at)
            + [f for f in faults if f.when])

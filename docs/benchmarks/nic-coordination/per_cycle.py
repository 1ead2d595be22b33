"""Bytes a host's NIC carried (sent + received, mean over hosts) per coordination cycle:
the difference between the 25 s and the 5 s idle runs over the difference in cycles;
and for the alltoalls, bytes per call beyond the cycles they took."""
import glob
import json
import os
import statistics
import sys


def load(folder, name):
    nic = os.path.join(folder, f"{name}.nic.json")
    if not os.path.exists(nic):
        return None
    during = json.load(open(nic))["during"].values()
    sent = statistics.mean(v["tx_bytes"] + v["rx_bytes"] for v in during)
    cycles = open(os.path.join(folder, f"{name}.tl.json")).read().count("CYCLE_START")
    return sent, cycles


def main(folder):
    print("shape,variant,bytes,per,cycles_per_second_or_per_call")
    for shape in ("4x2", "2x4"):
        per_cycle = {}
        for variant in ("none", "host", "hostpeer"):
            short, long = load(folder, f"{variant}-{shape}-i5"), load(folder, f"{variant}-{shape}-i25")
            if short and long:
                per_cycle[variant] = (long[0] - short[0]) / (long[1] - short[1])
                print(f"{shape},{variant},{per_cycle[variant]:.0f},cycle,{(long[1] - short[1]) / 20:.0f}")
        none, calls = load(folder, f"a2a-{shape}-k0"), load(folder, f"a2a-{shape}-k400")
        if none and calls and "none" in per_cycle:
            cycles = calls[1] - none[1]
            beyond = (calls[0] - none[0]) - cycles * per_cycle["none"]
            print(f"{shape},alltoall,{beyond / 400:.0f},call beyond its cycles,{cycles / 400:.1f}")


if __name__ == "__main__":
    main(sys.argv[1] if len(sys.argv) > 1 else "runs/nic-coordination")

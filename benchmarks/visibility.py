"""Which fault variants each framework view can show at all, measured on the library's own runs.

A held-out run written in TRL's or OpenRLHF's view logs only that framework's metrics. When none of
them changes under a fault in the library's own runs, the library's fingerprints and findings cannot
name it from that view, and the held-out set's top-1 has a ceiling below 100% that no change to the
ranking lifts. This benchmark measures that ceiling without looking at the held-out runs: every
fingerprint of the shipped library is scored against its own campaign-v2 fault runs and their
healthy twins, read in each framework view exactly as the held-out export writes them
(``moeproxy.reproduction.views``), and the whole-run findings (``signatures/levels.py``) are read
off the same runs.

A variant is *visible* in a view when one of its fingerprints separates its own fault runs from
their twins there (fault median minus best twin ≥ ``fingerprint.MIN_SEPARATION``, the bar the
matcher itself applies), or when a whole-run finding for its class fires on most of its fault runs
and on none of its twins. ``benchmarks/diagnosis.py --stages evaluate`` reads the result and
reports the held-out figures on the visible runs beside the whole set.

    python benchmarks/visibility.py --work runs/campaign-v2
    # writes benchmarks/results/view_visibility.json (the campaign's traces are restored from
    # benchmarks/results/campaign-v2 first: that needs the proxy, rebuilt if absent, a few minutes)
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "benchmarks"))

import evalsets  # the library hash helper (found through the path above)

VIEWS = ("verl", "trl", "openrlhf")  # the views the held-out export writes (diagnosis.VIEW_ORDER)
OUT = ROOT / "benchmarks" / "results" / "view_visibility.json"


def measure(library_path: Path, campaign_dir: Path) -> dict[str, Any]:
    """Per fingerprint and view: separation, best twin score, and how many fault runs and twins a
    whole-run finding for the class fires on."""
    from moeproxy.signatures import dtw
    from moeproxy.signatures.build import load_trace_dir, separation, signatures_of
    from moeproxy.signatures.fingerprint import MIN_SEPARATION, load_library

    dtw.warm()
    lib = load_library(library_path)
    twins_dir = campaign_dir / "library" / "healthy"
    out: dict[str, Any] = {}
    for fp in lib.fingerprints:
        trace_dir = fp.provenance.get("trace_dir")
        if fp.fault_class == "healthy" or not trace_dir:
            continue
        entry = campaign_dir / "library" / Path(trace_dir).name
        per_view = {}
        for view in VIEWS:
            ts = load_trace_dir(entry, twins_from=twins_dir, view=view)
            seeds = sorted(s for s in ts.fault_runs if s in ts.healthy_runs)
            if not seeds:
                continue
            faults = signatures_of([ts.fault_runs[s] for s in seeds], lib.params)
            twins = signatures_of([ts.healthy_runs[s] for s in seeds], lib.params)
            sep, twin = separation(fp, faults, twins)
            on_faults, on_twins = (_finding_runs(sigs, fp.fault_class) for sigs in (faults, twins))
            per_view[view] = {
                "separation": sep, "twin_score": twin, "runs": len(seeds),
                "finding_on_faults": on_faults, "finding_on_twins": on_twins,
                "visible": sep >= MIN_SEPARATION or (2 * on_faults > len(seeds) and on_twins == 0),
            }
        out[fp.id] = {"fault_class": fp.fault_class, "variant": fp.variant, "from_start": fp.from_start,
                      "views": per_view}
        print(f"{fp.id:70s} " + "  ".join(f"{v}: {'visible' if r['visible'] else 'hidden '} ({r['separation']:+.2f})"
                                          for v, r in per_view.items()), flush=True)
    # The commit says which whole-run rules ran: a rule added later can make more variants visible.
    return {"library": str(library_path), "library_sha256": evalsets._file_hash(library_path),
            "commit": evalsets._commit(),
            "min_separation": MIN_SEPARATION, "views": list(VIEWS), "fingerprints": out}


def _finding_runs(sigs, fault_class: str) -> int:
    """How many of the runs a whole-run finding for ``fault_class`` fires on."""
    from moeproxy.signatures.levels import whole_run_evidence

    return sum(any(fault_class in f.supports for f in whole_run_evidence(s.run)) for s in sigs)


def run_visible(label: str, variant: str | None, onset: int | None, view: str | None,
                visibility: Mapping[str, Any]) -> bool | None:
    """Whether a held-out run's variant is visible in its view (by any fingerprint of the class and
    variant with the same onset kind: from step 0 or later); None when nothing was measured for it.
    A healthy run is always visible: there is nothing to show."""
    if label == "healthy":
        return True
    from_start = onset in (0, None)
    seen = [rec["views"][view]["visible"] for rec in visibility.get("fingerprints", {}).values()
            if rec["fault_class"] == label and rec["variant"] == variant and rec["from_start"] == from_start
            and view in rec["views"]]
    return any(seen) if seen else None


def main(argv: Sequence[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--work", default=str(ROOT / "runs" / "campaign-v2"), help="campaign_v2.py's work directory")
    ap.add_argument("--library", default=str(ROOT / "signatures" / "library"))
    ap.add_argument("--keep-ratio", type=float, default=0.75)
    ap.add_argument("--out", default=str(OUT))
    args = ap.parse_args(argv)
    import campaign_v2

    work = Path(args.work)
    proxy = campaign_v2.stage_proxy(work, args.keep_ratio)
    campaign_v2.restore(proxy, work / "campaign")
    report = measure(Path(args.library), work / "campaign")
    Path(args.out).write_text(json.dumps(report, indent=1) + "\n")
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()

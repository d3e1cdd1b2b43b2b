"""Import time and peak memory of fresh processes: import dpsql, find a synthesizer, release.

    python benchmarks/import_time.py [--runs 5] [--rev REV] [--quick] [--json]

Three scenarios, each in a fresh interpreter (``python -X importtime``), ``--runs``
times, medians:

- ``import``: ``import dpsql``;
- ``lookup``: ``dpsql.synth.get("independent")``;
- ``release``: ``Session.release`` of ``independent`` (epsilon 1) of the bundled
  Adult sample (dpsql/data/adult_sample.csv, 5,000 rows, under
  dpsql/data/adult.yaml), on a fresh copy of a store another process made; its
  wall time is the process's, start to exit, worker included.

Import time is the sum of the cumulative times ``-X importtime`` gives the
top-level imports the scenario made (so lazy imports count when they happen);
peak memory is the process's ``ru_maxrss``; the heavy modules are those of
torch, jax, numpyro, mbi and scipy.stats in ``sys.modules`` at the end. The
release's worker (a fresh ``python -I`` of its own, dpsql/worker.py) is measured
the same way: the benchmark starts it with ``-X importtime`` and reads its
``sys.modules`` as it finishes; its peak memory is its own high-water mark
(``VmHWM``, Linux), since Linux keeps in ``ru_maxrss`` across exec the resident
size of the owner it forked from (the code before showed a 503 MB worker that
had imported none of the heavy modules).

``--rev REV`` also runs the scenarios on REV's code (``git archive`` into a
temporary folder, the same interpreter), the runs of the two codes interleaved,
for a before/after comparison.

Targets (issues 42 and 44): finding ``independent`` and releasing it under 1.5 s
of import time, with neither torch nor jax imported; a fresh-process release of
the Adult sample within 3 s end to end.

Measured when the synthesizers became declared and loaded on use (``--runs 5
--rev faad88c``, a 2-core host at load 1.2-1.4), against the code before, which
imported every built-in synthesizer to find one:

    scenario  import time          peak memory      end to end   heavy modules
    lookup    0.40 s (was 4.84 s)  83 MB (455 MB)   0.53 s       none (torch, jax, numpyro,
                                                                   scipy.stats)
    release   0.61 s + worker      156 MB (523 MB)  2.41 s       none (the same four)
              0.77 s (4.95 + 0.90)                  (7.86 s)
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from _common import print_table, readme

ROOT = Path(__file__).resolve().parents[1]
HEAVY = ("torch", "jax", "numpyro", "mbi", "scipy.stats")

#: What a scenario's process runs: its imports are counted between the two markers.
CHILD = r"""
import sys
sys.stderr.write("@@start\n"); sys.stderr.flush()
scenario = sys.argv[1]
if scenario == "import":
    import dpsql
elif scenario == "lookup":
    import dpsql.synth
    dpsql.synth.get("independent")
else:
    store, log, report = sys.argv[2:5]
    import dpsql.worker
    _start_worker(dpsql.worker, log, report)
    import dpsql
    with dpsql.connect(store, "admin") as admin:
        admin.release("adult", synthesizer="independent", epsilon=1, name="bench_ind")
sys.stderr.write("@@end\n"); sys.stderr.flush()
import json, resource
print(json.dumps({"heavy": [m for m in HEAVY if m in sys.modules],
                  "rss_kb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss,
                  "dpsql": sys.modules["dpsql"].__file__}))
"""

#: Wraps the worker's start: ``-X importtime`` into a log, and a report of its modules and
#: peak memory written just before it says it is done (dpsql/worker.py's BOOT and main).
INSTRUMENT = r'''
def _start_worker(worker, log, report):
    import subprocess as real
    marker = "import sys\nsys.stderr.write('@@start\\n'); sys.stderr.flush()\n"
    wrap = """
class _Reporting:
    def __init__(self, conn):
        self.conn = conn
    def __getattr__(self, name):
        return getattr(self.conn, name)
    def send(self, message):
        if message[0] in ("done", "error"):
            sys.stderr.write("@@end\\n"); sys.stderr.flush()
            import json
            with open("/proc/self/status") as status:  # VmHWM: this process's own peak
                peak = next(int(line.split()[1]) for line in status if line.startswith("VmHWM"))
            with open(REPORT, "w") as out:
                json.dump({"heavy": [m for m in HEAVY if m in sys.modules], "rss_kb": peak,
                           "dpsql": sys.modules["dpsql"].__file__}, out)
        self.conn.send(message)
main(_Reporting(conn))
""".replace("REPORT", repr(report)).replace("HEAVY", repr(HEAVY))
    if "main(conn)\n" not in worker.BOOT:
        return
    worker.BOOT = marker + worker.BOOT.replace("main(conn)\n", wrap)

    class Shim:
        DEVNULL, PIPE, TimeoutExpired = real.DEVNULL, real.PIPE, real.TimeoutExpired

        @staticmethod
        def Popen(args, **kwargs):
            return real.Popen([args[0], "-X", "importtime", *args[1:]],
                              stderr=open(log, "w"), **kwargs)

    worker.subprocess = Shim
'''


def import_seconds(stderr: str) -> float:
    """Seconds of the top-level imports between the markers of a ``-X importtime`` log."""
    inside, total = False, 0
    for line in stderr.splitlines():
        if line.startswith("@@start"):
            inside = True
        elif line.startswith("@@end"):
            break
        elif inside and line.startswith("import time:") and "|" in line:
            _, cumulative, name = line.split("|", 2)
            if cumulative.strip().isdigit() and not name[1:].startswith(" "):
                total += int(cumulative)
    return total / 1e6


def make_store(code: Path, folder: Path) -> Path:
    """A store of the Adult sample made by ``code``'s dpsql (in its own process)."""
    path = folder / "template.duckdb"
    script = ("import sys, dpsql\n"
              "store, _ = dpsql.init(sys.argv[1], sys.argv[2], {'adult': sys.argv[3]})\n"
              "store.close()\n")
    subprocess.run([sys.executable, "-c", script, str(path), str(code / "dpsql/data/adult.yaml"),
                    str(code / "dpsql/data/adult_sample.csv")], check=True,
                   env=environment(code), cwd=folder, capture_output=True, text=True)
    return path


def environment(code: Path) -> dict[str, str]:
    return {**os.environ, "PYTHONPATH": str(code), "PYTHONWARNINGS": "ignore"}


def run(code: Path, scenario: str, template: Path, folder: Path) -> dict[str, Any]:
    """One fresh process of ``scenario`` on ``code``: its figures."""
    args = [sys.executable, "-X", "importtime", "-c",
            f"HEAVY = {HEAVY!r}\n{INSTRUMENT}{CHILD}", scenario]
    log, report = folder / "worker.log", folder / "worker.json"
    if scenario == "release":
        store = folder / "run.duckdb"
        for stale in folder.glob("run.duckdb*"):
            stale.unlink()
        shutil.copy(template, store)
        report.unlink(missing_ok=True)
        args += [str(store), str(log), str(report)]
    start = time.perf_counter()
    done = subprocess.run(args, env=environment(code), cwd=folder, capture_output=True,
                          text=True, timeout=600)
    wall = time.perf_counter() - start
    if done.returncode != 0:
        raise SystemExit(f"{scenario} on {code} failed:\n{done.stderr[-3000:]}")
    facts = json.loads(done.stdout.strip().splitlines()[-1])
    if not Path(facts["dpsql"]).is_relative_to(code):
        raise SystemExit(f"{scenario} imported {facts['dpsql']}, not the code under {code}")
    out = {"import_s": import_seconds(done.stderr), "wall_s": wall,
           "rss_mb": facts["rss_kb"] / 1024, "heavy": facts["heavy"]}
    if scenario == "release" and report.exists():
        worker = json.loads(report.read_text())
        if not Path(worker["dpsql"]).is_relative_to(code):
            raise SystemExit(f"the worker imported {worker['dpsql']}, not the code under {code}")
        out.update(worker_import_s=import_seconds(log.read_text()),
                   worker_rss_mb=worker["rss_kb"] / 1024, worker_heavy=worker["heavy"])
    return out


def checkout(rev: str, folder: Path) -> Path:
    """REV's tracked files under ``folder`` (git archive: the repository is left as it is)."""
    target = folder / f"rev-{rev}"
    target.mkdir()
    archive = subprocess.run(["git", "-C", str(ROOT), "archive", rev], check=True,
                             capture_output=True).stdout
    subprocess.run(["tar", "-x", "-C", str(target)], input=archive, check=True)
    return target


def summary(label: str, scenario: str, runs: list[dict[str, Any]]) -> dict[str, Any]:
    def median(key: str) -> float:
        return statistics.median(r[key] for r in runs)

    row: dict[str, Any] = {"code": label, "scenario": scenario, "import_s": median("import_s"),
                           "wall_s": median("wall_s"), "rss_mb": median("rss_mb"),
                           "heavy": ",".join(sorted({m for r in runs for m in r["heavy"]}))
                           or "none"}
    row.update(worker_import_s="-", worker_rss_mb="-", worker_heavy="-")
    if "worker_import_s" in runs[0]:
        row.update(worker_import_s=median("worker_import_s"),
                   worker_rss_mb=median("worker_rss_mb"),
                   worker_heavy=",".join(sorted({m for r in runs for m in r["worker_heavy"]}))
                   or "none")
    return row


def sentence(rows: dict[str, dict[str, Any]], load: str) -> str:
    imp, look, rel = rows["import"], rows["lookup"], rows["release"]
    worker = (f" + worker {rel['worker_import_s']:.2f} s, {rel['worker_rss_mb']:.0f} MB, "
              f"heavy: {rel['worker_heavy']}" if rel["worker_heavy"] != "-" else "")
    return (f"import dpsql {imp['import_s']:.2f} s; get('independent') "
            f"{look['import_s']:.2f} s import time, {look['rss_mb']:.0f} MB, heavy: "
            f"{look['heavy']}; independent release of the Adult sample "
            f"{rel['import_s']:.2f} s import time{worker}; {rel['wall_s']:.2f} s end to end, "
            f"{rel['rss_mb']:.0f} MB, heavy: {rel['heavy']} (load {load})")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=5)
    parser.add_argument("--rev", help="also measure this git revision's code (before/after)")
    parser.add_argument("--quick", action="store_true", help="one run each")
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args()
    runs = 1 if args.quick else args.runs
    scenarios = ("import", "lookup", "release")
    loads = [os.getloadavg()[0]]
    with tempfile.TemporaryDirectory(prefix="dpsql-import-time-") as tmp:
        folder = Path(tmp)
        codes = {"this": ROOT}
        if args.rev:
            codes[args.rev] = checkout(args.rev, folder)
        templates = {}
        for label, code in codes.items():
            work = folder / f"work-{label}"
            work.mkdir()
            templates[label] = make_store(code, work)
        results: dict[tuple[str, str], list[dict[str, Any]]] = {}
        for _ in range(runs):
            for label, code in codes.items():  # interleaved: both codes see the same host
                for scenario in scenarios:
                    work = folder / f"work-{label}"
                    results.setdefault((label, scenario), []).append(
                        run(code, scenario, templates[label], work))
            loads.append(os.getloadavg()[0])
    rows = [summary(label, scenario, results[label, scenario])
            for label in codes for scenario in scenarios]
    print_table(rows, args.json)
    load = f"{min(loads):.1f}-{max(loads):.1f}"
    for label in codes:
        mine = {r["scenario"]: r for r in rows if r["code"] == label}
        code = "" if label == "this" else f"code at {label}: "
        readme(f"fresh process, median of {runs}: {code}{sentence(mine, load)}")


if __name__ == "__main__":
    main()

#!/usr/bin/env python3
"""Assembles leasegate's Azure Functions app (a custom handler running the Spin app) and checks it.

    deploy/azure-functions/assemble.py --spin /path/to/linux/spin [--out dist/azure-functions]
    deploy/azure-functions/assemble.py --check-only

The output folder is what `func azure functionapp publish <app> --custom` (or a zip deploy)
uploads: host.json, one folder per function with its function.json, launch.sh, the components
(components/*.wasm, built here in release for wasm32-wasip2), spin.toml (the project's manifest
plus the timer routes of timer-routes.toml, with the component paths rewritten) and the Spin
binary you supply (Linux x86_64, the one the Functions host runs, Spin 3.0 or later; the script
cannot download it, and refuses a binary that is not an x86_64 ELF executable). launch.sh is
host.json's defaultExecutablePath, the one file Core Tools' zip marks executable: it copies
`spin` to a writable folder, marks it executable and starts it. Every function.json is checked against the manifest's routes: an HTTP trigger's route must
reach a Spin route below /api, a timer trigger's function name must be a Spin route
(POST /{FunctionName}), its schedule six NCRONTAB fields. --check-only checks without building.
"""
import argparse
import json
import re
import shutil
import subprocess
import sys
import tomllib
from pathlib import Path

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent.parent
SOURCE_PREFIX = "target/wasm32-wasip2/release/"


def azure_manifest_text() -> str:
    """The project's spin.toml with the timer routes appended, component paths as assembled."""
    text = (ROOT / "spin.toml").read_text()
    text += "\n" + (HERE / "timer-routes.toml").read_text()
    # The Functions host's timer channel is on here, and only here.
    text = text.replace('azure_functions = { default = "off" }', 'azure_functions = { default = "on" }')
    return text.replace(f'source = "{SOURCE_PREFIX}', 'source = "components/')


def spin_routes(manifest: dict) -> list[tuple[str, str]]:
    return [(t["route"], t["component"]) for t in manifest.get("trigger", {}).get("http", [])]


def route_matches(route: str, path: str) -> bool:
    """Spin's matching: exact, or a trailing wildcard `/base/...`."""
    if route.endswith("/..."):
        base = route[: -len("/...")]
        return path == base or path.startswith(base + "/")
    return path.rstrip("/") == route.rstrip("/")


def sample_path(route_template: str) -> str:
    """A concrete path for an Azure route template: `gate/{*key}` -> `/api/gate/sample/key`."""
    path = re.sub(r"\{\*[^}]+\}", "sample/key", route_template)
    path = re.sub(r"\{[^}]+\}", "sample", path)
    return "/api/" + path.strip("/")


def check(manifest: dict, folder_root: Path = HERE) -> list[str]:
    problems = []
    routes = spin_routes(manifest)
    host = json.loads((folder_root / "host.json").read_text())
    if host.get("extensions", {}).get("http", {}).get("routePrefix") != "api":
        problems.append("host.json: extensions.http.routePrefix must be api")
    if not host.get("customHandler", {}).get("enableForwardingHttpRequest"):
        problems.append("host.json: customHandler.enableForwardingHttpRequest must be true")
    functions = sorted(p.parent for p in folder_root.glob("*/function.json"))
    if not functions:
        problems.append("no */function.json found")
    for folder in functions:
        name = folder.name
        where = f"{name}/function.json"
        if not re.fullmatch(r"[A-Za-z][A-Za-z0-9_-]{0,127}", name):
            problems.append(f"{where}: {name!r} is not a valid function name")
        bindings = json.loads((folder / "function.json").read_text()).get("bindings", [])
        triggers = [b for b in bindings if b.get("type", "").endswith("Trigger")]
        if len(triggers) != 1:
            problems.append(f"{where}: needs exactly one trigger binding")
            continue
        t = triggers[0]
        if t["type"] == "httpTrigger":
            path = sample_path(t.get("route", name))
            if not any(route_matches(r, path) for r, _ in routes):
                problems.append(f"{where}: route {t.get('route')!r} ({path}) reaches no Spin route")
            if not any(b.get("type") == "http" and b.get("direction") == "out" for b in bindings):
                problems.append(f"{where}: an HTTP trigger needs an http output binding")
        elif t["type"] == "timerTrigger":
            if not any(r == f"/{name}" for r, _ in routes):
                problems.append(f"{where}: a timer function needs the Spin route /{name} (timer-routes.toml)")
            fields = str(t.get("schedule", "")).split()
            if len(fields) != 6:
                problems.append(f"{where}: schedule must be six NCRONTAB fields (sec min hour day month weekday)")
        else:
            problems.append(f"{where}: unsupported trigger {t['type']}")
    if manifest.get("variables", {}).get("azure_functions", {}).get("default") != "on":
        problems.append("spin.toml: the variable azure_functions must exist (assemble.py turns it on)")
    components = manifest.get("component", {})
    for route, component in routes:
        if component not in components:
            problems.append(f"spin.toml: route {route} names unknown component {component}")
    return problems


# ELF header fields (the System V ABI's gABI, "ELF Header"): e_ident[EI_CLASS] at 4,
# e_ident[EI_DATA] at 5, e_machine at 18, e_phoff at 32, e_phentsize at 54, e_phnum at 56 (64-bit).
ELFCLASS64 = 2
ELFDATA2LSB = 1
EM_X86_64 = 62
PT_INTERP = 3
MACHINES = {3: "x86 (32-bit)", 40: "ARM (32-bit)", 62: "x86_64", 183: "aarch64 (arm64)", 243: "RISC-V"}


def check_spin_binary(data: bytes) -> tuple[str | None, bool]:
    """(what is wrong with it for the Functions host, or None; whether it is linked dynamically).

    The Functions host's Linux workers are x86_64: a binary for another machine, or not an ELF
    executable at all, would fail only at start, in Azure, as a worker that restarts in a loop.
    """
    if len(data) < 64 or data[:4] != b"\x7fELF":
        return "not a Linux (ELF) binary; give the Spin CLI for Linux x86_64", False
    if data[4] != ELFCLASS64 or data[5] != ELFDATA2LSB:
        return "not a 64-bit little-endian ELF binary; give the Spin CLI for Linux x86_64", False
    machine = int.from_bytes(data[18:20], "little")
    if machine != EM_X86_64:
        name = MACHINES.get(machine, f"machine {machine}")
        return f"built for {name}, not x86_64; give the Spin CLI for Linux x86_64", False
    phoff = int.from_bytes(data[32:40], "little")
    phentsize = int.from_bytes(data[54:56], "little")
    phnum = int.from_bytes(data[56:58], "little")
    dynamic = any(
        int.from_bytes(data[phoff + i * phentsize: phoff + i * phentsize + 4], "little") == PT_INTERP
        for i in range(phnum)
        if phoff + (i + 1) * phentsize <= len(data)
    )
    return None, dynamic


def job_timer_schedule(jobs: str) -> str:
    """scheduled-job's timer schedule for the jobs table `jobs`: the trigger
    scripts/cron_manifest.py writes for it (six NCRONTAB fields, the one place triggers are
    derived)."""
    sys.path.insert(0, str(ROOT / "scripts"))
    import cron_manifest
    expression, _ = cron_manifest.table_trigger((ROOT / "spin.toml").read_text(), jobs)
    return expression


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--spin", type=Path, help="the Spin CLI binary for Linux x86_64 to ship")
    parser.add_argument("--out", type=Path, default=ROOT / "dist" / "azure-functions")
    parser.add_argument("--check-only", action="store_true", help="check the files, build nothing")
    parser.add_argument("--functions", type=Path, default=HERE,
                        help="check host.json and */function.json in this folder instead (for tests)")
    parser.add_argument("--jobs", type=Path,
                        help="scheduled-job's jobs table (TOML): its timer fires at the finest "
                             "cadence the jobs need (scripts/cron_manifest.py derives it)")
    args = parser.parse_args()

    text = azure_manifest_text()
    manifest = tomllib.loads(text)
    problems = check(manifest, args.functions)
    if problems:
        for p in problems:
            print(f"assemble: {p}", file=sys.stderr)
        return 1
    print(f"checked {len(list(args.functions.glob('*/function.json')))} function.json files against the manifest's routes")
    if args.check_only:
        return 0
    if args.spin is None or not args.spin.is_file():
        print("assemble: --spin must name the Spin CLI binary for Linux x86_64", file=sys.stderr)
        return 2
    problem, dynamic = check_spin_binary(args.spin.read_bytes())
    if problem:
        print(f"assemble: --spin {args.spin}: {problem}", file=sys.stderr)
        return 2
    if dynamic:
        print(f"assemble: warning: {args.spin} is linked dynamically: it runs only where the image's "
              "glibc is as new as the one it was built against; Spin's static Linux x86_64 build "
              "(spin-vX.Y.Z-static-linux-amd64) does not depend on it", file=sys.stderr)

    print("building the components (wasm32-wasip2, release)")
    packages = sorted({c["build"]["command"].split(" -p ")[-1] for c in manifest["component"].values()})
    cmd = ["cargo", "build", "--release", "--locked", "--target", "wasm32-wasip2"]
    for p in packages:
        cmd += ["-p", p]
    subprocess.run(cmd, cwd=ROOT, check=True)

    out = args.out
    if out.exists():
        shutil.rmtree(out)
    (out / "components").mkdir(parents=True)
    shutil.copy2(HERE / "host.json", out / "host.json")
    shutil.copy2(HERE / "launch.sh", out / "launch.sh")
    for fj in HERE.glob("*/function.json"):
        (out / fj.parent.name).mkdir()
        shutil.copy2(fj, out / fj.parent.name / "function.json")
    if args.jobs:
        schedule = job_timer_schedule(args.jobs.read_text())
        fj = out / "scheduled-job" / "function.json"
        spec = json.loads(fj.read_text())
        spec["bindings"][0]["schedule"] = schedule
        fj.write_text(json.dumps(spec, indent=2) + "\n")
        print(f"scheduled-job's timer: {schedule} (the finest cadence its jobs need)")
    for component in manifest["component"].values():
        name = Path(component["source"]).name
        shutil.copy2(ROOT / SOURCE_PREFIX / name, out / "components" / name)
    (out / "spin.toml").write_text(text)
    shutil.copy2(args.spin, out / "spin")
    (out / "spin").chmod(0o755)
    print(f"assembled {out}; publish it with: cd {out} && func azure functionapp publish <app> --custom")
    return 0


if __name__ == "__main__":
    sys.exit(main())

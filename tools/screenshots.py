"""Screenshots of the Prefect UI showing spotrl runs, for the docs (docs/img/*.png).

    .venv/bin/python tools/screenshots.py [--out docs/img] [--keep]

What it does, in a temporary directory with a PREFECT_HOME of its own:

1. follows the `$` lines at the top of deployments/prefect.yaml, as a user types them (a free port
   instead of 4200; a project directory with links to spotrl/ and deployments/, so the runs' relative
   run directories land in the temporary directory, not in the checkout): the server, `prefect config
   set PREFECT_API_URL`, the `spotrl` work pool, `prefect deploy`, a process worker, and the two
   documented `prefect deployment run` lines;
2. submits one more run through the REST API with a failpoint in its job variables (SPOTRL_KILL_AT:
   the flow process SIGKILLs itself at the first publish), so the deployment's automation re-submits
   it as attempt 2, which resumes the run directory;
3. waits for every run to finish, then screenshots pages of the UI with headless Chromium driven over
   the Chrome DevTools protocol (the UI is a single-page app: each page is loaded, then polled until
   the text it must show is there and no loading indicator is left);
4. stops the worker, the server and Chromium, also on error or Ctrl-C.

Needs: Debian's Chromium (`apt-get install -y chromium`; or set CHROMIUM=/path/to/chrome), and the
project's virtualenv (prefect; `websockets` and `httpx` come with prefect; Pillow, if installed, is
used to shrink a PNG over 300 KB). Takes about 2-4 minutes on a laptop-class CPU.
"""

from __future__ import annotations

import argparse
import base64
import io
import json
import os
import shlex
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import httpx
from websockets.sync.client import connect

from spotrl.flows.testing import documented_commands, retry_unavailable_transport
from spotrl.ports import free_port

REPO = Path(__file__).resolve().parents[1]
DEPLOYMENT_FILE = REPO / "deployments" / "prefect.yaml"
PREFECT = str(Path(sys.executable).parent / "prefect")
TERMINAL = {"COMPLETED", "FAILED", "CRASHED", "CANCELLED"}
WIDTH, HEIGHT = 1400, 900
MAX_BYTES = 300_000


def log(msg: str) -> None:
    print(f"[screenshots {time.strftime('%H:%M:%S')}] {msg}", flush=True)


class Processes:
    """Background processes, each in its own session, stopped in reverse order."""

    def __init__(self, logs: Path):
        self.logs = logs
        self.procs: list[tuple[str, subprocess.Popen]] = []

    def spawn(self, name: str, argv: list[str], **kw) -> subprocess.Popen:
        out = open(self.logs / f"{name}.log", "w")
        proc = subprocess.Popen(argv, stdout=out, stderr=subprocess.STDOUT, start_new_session=True, **kw)
        self.procs.append((name, proc))
        return proc

    def log(self, name: str, tail: int = 4000) -> str:
        path = self.logs / f"{name}.log"
        return path.read_text(errors="replace")[-tail:] if path.exists() else ""

    def stop(self) -> None:
        for name, proc in reversed(self.procs):
            if proc.poll() is not None:
                continue
            log(f"stopping {name} (pid {proc.pid})")
            try:
                os.killpg(proc.pid, signal.SIGTERM)
                proc.wait(10)
            except subprocess.TimeoutExpired:  # an idle Prefect worker sometimes ignores SIGTERM
                os.killpg(proc.pid, signal.SIGKILL)
                proc.wait()
            except ProcessLookupError:
                pass


class Prefect:
    """The documented set-up on a free port; `api` is an httpx client on the REST API."""

    def __init__(self, base: Path, procs: Processes):
        self.procs = procs
        self.root = base / "project"
        self.root.mkdir()
        for name in ("spotrl", "deployments"):
            (self.root / name).symlink_to(REPO / name)
        home = base / "prefect-home"
        self.port = free_port()
        self.ui = f"http://127.0.0.1:{self.port}"
        self.env = dict(
            os.environ,
            PREFECT_HOME=str(home),
            PREFECT_API_DATABASE_CONNECTION_URL=f"sqlite+aiosqlite:///{home}/prefect.db",
            PREFECT_SERVER_ANALYTICS_ENABLED="false",
            # the UI's API address (else the UI calls 127.0.0.1:4200, whatever port the server is on)
            PREFECT_UI_API_URL=f"{self.ui}/api",
            PREFECT_WORKER_QUERY_SECONDS="1",
            PREFECT_WORKER_PREFETCH_SECONDS="1",
        )
        for setting in ("PREFECT_API_URL", "PREFECT_PROFILE", "PREFECT_RESULTS_LOCAL_STORAGE_PATH"):
            self.env.pop(setting, None)
        self.api = httpx.Client(
            base_url=f"{self.ui}/api", timeout=30, transport=retry_unavailable_transport((0.5, 1, 2, 4, 8))
        )
        self.documented_runs: list[list[str]] = []

    def cli(self, *args: str, timeout: float = 300) -> str:
        log("$ prefect " + shlex.join(args))
        out = subprocess.run(
            [PREFECT, *args], env=self.env, cwd=self.root, capture_output=True, text=True, timeout=timeout
        )
        if out.returncode != 0:
            raise RuntimeError(f"prefect {shlex.join(args)} exited {out.returncode}:\n{out.stdout}{out.stderr}")
        return out.stdout

    def wait_healthy(self, timeout: float = 180) -> None:
        deadline = time.monotonic() + timeout
        while True:
            try:
                if self.api.get("/health").status_code == 200:
                    return
            except httpx.TransportError:
                pass
            if time.monotonic() > deadline:
                raise TimeoutError(f"Prefect server not healthy after {timeout} s:\n{self.procs.log('server')}")
            time.sleep(0.5)

    def start(self) -> None:
        for command in documented_commands(DEPLOYMENT_FILE):
            assert command[0] == "prefect", command
            args = [a.replace("127.0.0.1:4200", f"127.0.0.1:{self.port}") for a in command[1:]]
            if args[:2] == ["server", "start"]:
                log("$ prefect " + shlex.join([*args, "--host", "127.0.0.1", "--port", str(self.port)]) + " &")
                self.procs.spawn(
                    "server",
                    [PREFECT, *args, "--host", "127.0.0.1", "--port", str(self.port)],
                    env=self.env,
                    cwd=self.root,
                )
                self.wait_healthy()
            elif args[:2] == ["worker", "start"]:
                log("$ prefect " + shlex.join(args) + " &")
                self.procs.spawn("worker", [PREFECT, *args], env=self.env, cwd=self.root)
            elif args[:2] == ["deployment", "run"]:
                self.documented_runs.append(args)
            else:
                self.cli(*args)

    def run_documented(self) -> list[str]:
        ids = []
        for args in self.documented_runs:
            out = self.cli(*args)
            ids.append(next(line.split("UUID:")[1].strip() for line in out.splitlines() if "UUID:" in line))
        return ids

    def submit_crashing(self, run_dir: str, marker: Path) -> str:
        deployment = self.api.get("/deployments/name/train/train").raise_for_status().json()
        body = {
            "parameters": {"preset": "smoke", "run_dir": run_dir},
            "job_variables": {"env": {"SPOTRL_KILL_AT": "publish.flip@1", "SPOTRL_KILL_ONCE": str(marker)}},
        }
        log(f"POST /deployments/{deployment['id']}/create_flow_run {json.dumps(body)}")
        return (
            self.api.post(f"/deployments/{deployment['id']}/create_flow_run", json=body).raise_for_status().json()["id"]
        )

    def wait_block_type(self, slug: str, timeout: float = 300) -> None:
        """Until the first run has registered the block type `slug` (see main())."""
        deadline = time.monotonic() + timeout
        while self.api.get(f"/block_types/slug/{slug}").status_code != 200:
            if time.monotonic() > deadline:
                raise TimeoutError(f"block type {slug} not registered after {timeout} s\n{self.procs.log('worker')}")
            time.sleep(1)

    def runs(self) -> list[dict]:
        return self.api.post("/flow_runs/filter", json={"sort": "EXPECTED_START_TIME_ASC"}).raise_for_status().json()

    def wait_all(self, run_dirs: set[str], crashed_dir: str, timeout: float = 900) -> list[dict]:
        """Every run finished, and the crashed chain has its re-submitted run finished too."""
        deadline = time.monotonic() + timeout
        last = ""
        while True:
            runs = self.runs()
            mine = [r for r in runs if r["parameters"].get("run_dir") in run_dirs]
            chain = [r for r in mine if r["parameters"].get("run_dir") == crashed_dir]
            states = ", ".join(f"{r['name']}: {r['state']['name']}" for r in mine)
            if states != last:
                log(states)
                last = states
            done = all(r["state"]["type"] in TERMINAL for r in mine)
            if done and len(chain) >= 2 and {r["parameters"].get("run_dir") for r in mine} == run_dirs:
                return mine
            if time.monotonic() > deadline:
                raise TimeoutError(f"runs not finished after {timeout} s: {states}\n{self.procs.log('worker')}")
            time.sleep(2)


class Chromium:
    """Headless Chromium on the DevTools protocol: one page, navigated, waited on, screenshotted."""

    def __init__(self, base: Path, procs: Processes):
        exe = os.environ.get("CHROMIUM") or shutil.which("chromium") or shutil.which("chromium-browser")
        if not exe:
            raise SystemExit("no chromium: apt-get install -y chromium (or set CHROMIUM=/path/to/chrome)")
        profile = base / "chromium-profile"
        profile.mkdir()
        procs.spawn(
            "chromium",
            [
                exe,
                "--headless=new",
                "--no-sandbox",
                "--disable-gpu",
                "--enable-unsafe-swiftshader",  # software WebGL: the run page's graph is a canvas
                "--hide-scrollbars",
                "--no-first-run",
                "--disable-extensions",
                f"--window-size={WIDTH},{HEIGHT}",
                "--remote-debugging-port=0",
                f"--user-data-dir={profile}",
                "about:blank",
            ],
        )
        port_file = profile / "DevToolsActivePort"
        deadline = time.monotonic() + 60
        while not (port_file.exists() and port_file.read_text().strip()):
            if time.monotonic() > deadline:
                raise TimeoutError(f"chromium did not start:\n{procs.log('chromium')}")
            time.sleep(0.2)
        port = int(port_file.read_text().split()[0])
        targets = httpx.get(f"http://127.0.0.1:{port}/json/list", timeout=10).json()
        page = next(t for t in targets if t["type"] == "page")
        self.ws = connect(page["webSocketDebuggerUrl"], max_size=64 * 2**20, open_timeout=30)
        self.next_id = 0
        self.call("Page.enable")
        self.call("Runtime.enable")
        self.call(
            "Emulation.setDeviceMetricsOverride",
            width=WIDTH,
            height=HEIGHT,
            deviceScaleFactor=1,
            mobile=False,
        )

    def call(self, method: str, timeout: float = 60, **params) -> dict:
        self.next_id += 1
        my_id = self.next_id
        self.ws.send(json.dumps({"id": my_id, "method": method, "params": params}))
        deadline = time.monotonic() + timeout
        while True:
            msg = json.loads(self.ws.recv(timeout=max(0.1, deadline - time.monotonic())))
            if msg.get("id") == my_id:
                if "error" in msg:
                    raise RuntimeError(f"{method}: {msg['error']}")
                return msg.get("result", {})

    def eval(self, expression: str):
        result = self.call("Runtime.evaluate", expression=expression, returnByValue=True)
        return result.get("result", {}).get("value")

    def text(self) -> str:
        return self.eval("document.body ? document.body.innerText : ''") or ""

    def loading(self) -> bool:
        """A loading indicator is visible (Prefect's p-loading-icon / skeletons)."""
        return bool(
            self.eval(
                """[...document.querySelectorAll(
                     '.p-loading-icon, [class*="loading"], [class*="skeleton"], [class*="spinner"]')]
                   .some(e => e.offsetParent !== null && e.getBoundingClientRect().height > 0)"""
            )
        )

    def wait_for(self, expect: list[str], timeout: float) -> None:
        """Until the page shows every string in `expect` and no loading indicator (or `timeout`)."""
        deadline = time.monotonic() + timeout
        while True:
            time.sleep(0.5)
            text = self.text()
            missing = [e for e in expect if e not in text]
            if not missing and not self.loading():
                return
            if time.monotonic() > deadline:
                log(
                    f"  WARNING: after {timeout} s still missing {missing} (loading={self.loading()}); taking it anyway"
                )
                return

    def shoot(
        self,
        url: str,
        out: Path,
        expect: list[str],
        tab: str | None = None,
        then_expect: list[str] = (),
        scroll_to: str | None = None,
        settle: float = 3.0,
        timeout: float = 90,
        height: int = HEIGHT,
    ) -> None:
        """Load `url`, wait for `expect`; optionally click the tab named `tab` and wait for
        `then_expect`, and scroll the element showing `scroll_to` to the middle; then screenshot."""
        log(f"{out.name}: {url}" + (f" [{tab}]" if tab else ""))
        self.call("Emulation.setDeviceMetricsOverride", width=WIDTH, height=height, deviceScaleFactor=1, mobile=False)
        self.call("Page.navigate", url=url)
        self.wait_for(list(expect), timeout)
        if tab:
            # the UI keeps the tab in ?tab=..., but only honours it when clicked, not on a fresh load
            self.eval(
                f"""(() => {{
                     const t = {json.dumps(tab)};
                     const el = [...document.querySelectorAll('button, a, [role=tab], li, span')]
                       .find(e => e.innerText && e.innerText.trim() === t && e.offsetParent !== null);
                     if (el) el.click();
                   }})()"""
            )
            self.wait_for(list(then_expect), timeout)
        if scroll_to:
            # twice: the log list loads more rows as it scrolls, which can move the line away again
            for _ in range(2):
                # the innermost element whose text has `scroll_to`, scrolled to the middle of the viewport
                self.eval(
                    f"""(() => {{
                         const t = {json.dumps(scroll_to)};
                         const els = [...document.querySelectorAll('body *')]
                           .filter(e => e.offsetParent !== null && e.innerText && e.innerText.includes(t));
                         const el = els[els.length - 1];
                         if (el) el.scrollIntoView({{block: 'center'}});
                       }})()"""
                )
                time.sleep(1.5)
        time.sleep(settle)  # charts and the graph animate in
        data = base64.b64decode(self.call("Page.captureScreenshot", format="png")["data"])
        out.write_bytes(shrink(data))
        log(f"  wrote {out} ({out.stat().st_size // 1024} KB)")

    def close(self) -> None:
        try:
            self.ws.close()
        except Exception:
            pass


def shrink(png: bytes) -> bytes:
    """A PNG under MAX_BYTES: quantized to 256 colours if it is bigger and Pillow is there."""
    if len(png) <= MAX_BYTES:
        return png
    try:
        from PIL import Image
    except ImportError:
        return png
    image = Image.open(io.BytesIO(png)).convert("RGB")
    buf = io.BytesIO()
    image.quantize(colors=256, method=Image.Quantize.MEDIANCUT).save(buf, format="PNG", optimize=True)
    return buf.getvalue() if buf.tell() < len(png) else png


def take_screenshots(browser: Chromium, ui: str, out: Path, run: dict, crashed: dict, resubmitted: dict) -> None:
    """The PNGs: `run` is a Completed run (its graph, task runs, artifacts), `crashed` a Crashed run
    and `resubmitted` the run the automation made of it."""
    page = f"{ui}/runs/flow-run/"
    # (a) the flow runs list, tall enough to show the list under the chart
    browser.shoot(
        f"{ui}/runs", out / "prefect-flow-runs.png", expect=[crashed["name"], resubmitted["name"]], height=1300
    )
    # (b) a run: its task runs graph, then the Task Runs tab
    browser.shoot(page + run["id"], out / "prefect-flow-run.png", expect=[run["name"], "Completed"], settle=5)
    browser.shoot(
        page + run["id"],
        out / "prefect-flow-run-task-runs.png",
        expect=[run["name"]],
        tab="Task Runs",
        then_expect=["update-i0003", "rollout-i0002-s1"],
        scroll_to="Task Runs",
    )
    # (c) the crashed run: its state, and the end of its logs (the worker's SIGKILL report)
    browser.shoot(page + crashed["id"], out / "prefect-crashed-run.png", expect=[crashed["name"], "Crashed"], settle=5)
    browser.shoot(
        page + crashed["id"],
        out / "prefect-crashed-run-logs.png",
        expect=[crashed["name"], "Crashed"],
        tab="Logs",
        then_expect=["memory allocation"],
        scroll_to="memory allocation",
    )
    # (d) its re-submitted run (Automation: train-resubmit-crashed), and the line saying what it continues
    browser.shoot(page + resubmitted["id"], out / "prefect-resubmitted-run.png", expect=[resubmitted["name"]], settle=5)
    browser.shoot(
        page + resubmitted["id"],
        out / "prefect-resubmitted-run-logs.png",
        expect=[resubmitted["name"]],
        tab="Logs",
        then_expect=["continuing flow run"],
        scroll_to="continuing flow run",
    )
    # (e) a run's artifacts, and the artifacts page
    browser.shoot(
        page + run["id"],
        out / "prefect-run-artifacts.png",
        expect=[run["name"]],
        tab="Artifacts",
        then_expect=["run-config", "training-progress", "held-out-pass-at-k", "run-summary"],
        scroll_to="Subflow Runs",
    )
    browser.shoot(f"{ui}/artifacts", out / "prefect-artifacts.png", expect=["run-config", "held-out-pass-at-k"])


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", type=Path, default=REPO / "docs" / "img", help="where the PNGs go")
    parser.add_argument("--keep", action="store_true", help="keep the temporary directory (logs, run dirs)")
    args = parser.parse_args()
    args.out.mkdir(parents=True, exist_ok=True)

    started = time.monotonic()
    base = Path(tempfile.mkdtemp(prefix="spotrl-screenshots-"))
    (base / "logs").mkdir()
    procs = Processes(base / "logs")
    browser = None
    # SIGTERM / SIGHUP end the script like Ctrl-C, so the `finally` below still stops everything
    for sig in (signal.SIGTERM, signal.SIGHUP):
        signal.signal(sig, signal.default_int_handler)
    try:
        log(f"working in {base}")
        prefect = Prefect(base, procs)
        prefect.start()
        crashed_dir = "runs/crashed"
        crashed_id = prefect.submit_crashing(crashed_dir, base / "killed")
        # Work-around: on a fresh server, runs that start together race to register the block type of
        # their result storage (spotrl/flows/results.py: block.save), and the loser fails with
        # ObjectAlreadyExists. So the documented runs go in once the first run has registered it.
        prefect.wait_block_type("spotrl-run-result-storage")
        documented_ids = prefect.run_documented()
        run_dirs = {crashed_dir} | {a[-1].split("=", 1)[1] for a in prefect.documented_runs}
        runs = prefect.wait_all(run_dirs, crashed_dir)
        by_id = {r["id"]: r for r in runs}
        chain = [r for r in runs if r["parameters"].get("run_dir") == crashed_dir]
        resubmitted = next(r for r in chain if r["id"] != crashed_id)
        for r in runs:
            log(f"{r['name']}: {r['state']['name']} {r['state'].get('message') or ''}")

        browser = Chromium(base, procs)
        take_screenshots(browser, prefect.ui, args.out, by_id[documented_ids[-1]], by_id[crashed_id], resubmitted)
        log(f"done in {time.monotonic() - started:.0f} s; PNGs in {args.out}")
        return 0
    except BaseException:
        log(f"FAILED; logs in {base / 'logs'}")
        for name in ("server", "worker"):
            tail = procs.log(name, 3000)
            if tail:
                print(f"--- {name} log (tail) ---\n{tail}", file=sys.stderr)
        args.keep = True
        raise
    finally:
        if browser:
            browser.close()
        procs.stop()
        if args.keep:
            log(f"kept {base}")
        else:
            shutil.rmtree(base, ignore_errors=True)


if __name__ == "__main__":
    sys.exit(main())

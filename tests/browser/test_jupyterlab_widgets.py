"""One real-browser test of the widgets: JupyterLab on a free loopback port, Debian's headless Chromium
driven by Playwright, notebook 00_engine_tour run at smoke size with INTERACTIVE=True, its slider moved,
and the plot beside it checked to have been redrawn.

Marked `browser`, which pyproject's addopts deselects from `make test`; `make test-browser` installs
Chromium and Playwright and runs it (`-m browser`). It skips, with the reason, only where Chromium or
Playwright is missing. Screenshots (before.png, after.png, and failure.png on a failure) and the server's
log go to the test's temporary directory, whose path the test prints."""

from __future__ import annotations

import json
import os
import re
import secrets
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
from dataclasses import dataclass
from pathlib import Path

import pytest

pytestmark = pytest.mark.browser

CHROMIUM = Path("/usr/bin/chromium")
# As root, and on a network that reaches nothing but the package registries: without the background-networking
# flags Chromium's own connections are refused and slow everything down. The profile is a fresh directory.
CHROMIUM_FLAGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
                  "--disable-background-networking", "--disable-component-update", "--disable-sync"]
NOTEBOOK = "00_engine_tour"
# Generous limits for 2 busy cores; each failure says which step ran out of time.
SERVER_START_S = 90
NOTEBOOK_OPEN_S = 120
RUN_ALL_S = 420  # the notebook's smoke run: 30-60 s on 2 cores
REDRAW_S = 240
SHUTDOWN_S = 30

# The widget cell, found by its slider (not by Python names, so a helper in lab.workflow.widgets that builds the same
# slider plus output area keeps this test valid); the plot is the image in that cell's output area.
SLIDER = ".jupyter-widgets .widget-slider, .jupyter-widgets.widget-slider"
HANDLE = "[role='slider']"
ERROR_TEXT = "Traceback (most recent call last)"


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _tail(path: Path, n: int = 3000) -> str:
    try:
        return path.read_text(errors="replace")[-n:]
    except OSError:
        return ""


def _wait_for(step: str, check, timeout: float, detail=lambda: "", interval: float = 0.5):
    """Poll `check` until it returns something truthy; on timeout fail naming `step`, with `detail()`."""
    deadline = time.monotonic() + timeout
    while True:
        value = check()
        if value:
            return value
        if time.monotonic() > deadline:
            more = detail()
            pytest.fail(f"timed out after {timeout:.0f} s: {step}" + (f"\n{more}" if more else ""), pytrace=False)
        time.sleep(interval)


def _prepare_notebook(root: Path) -> Path:
    """The study notebook, copied into `root` with its parameters injected (not executed): a new cell after
    the `parameters` cell, as papermill would add it, at the smoke preset with the widgets on."""
    import nbformat

    from lab.workflow.notebook import NOTEBOOKS_DIR, declared_parameters

    source = NOTEBOOKS_DIR / f"{NOTEBOOK}.ipynb"
    declared = declared_parameters(source)
    params = {"PRESET": "smoke", "INTERACTIVE": True}
    assert set(params) <= set(declared), f"{NOTEBOOK} no longer declares {sorted(set(params) - set(declared))}"
    nb = nbformat.read(source, as_version=4)
    first = next(i for i, c in enumerate(nb.cells) if "parameters" in c.metadata.get("tags", []))
    cell = nbformat.v4.new_code_cell("# Parameters\n" + "".join(f"{k} = {v!r}\n" for k, v in params.items()))
    cell.metadata["tags"] = ["injected-parameters"]
    nb.cells.insert(first + 1, cell)
    nb.metadata["kernelspec"] = {"name": "python3", "display_name": "Python 3", "language": "python"}
    nb.metadata.pop("jupytext", None)  # no .py twin beside the copy: keep jupytext from pairing on save
    path = root / source.name
    nbformat.write(nb, path)
    return path


def _write_settings(settings: Path) -> None:
    """JupyterLab user settings for the test: every cell attached to the page (no windowing, so the widget
    cell is in the DOM wherever it scrolls), and no news or update checks (no network, no toast)."""
    overrides = {"notebook-extension/tracker": {"windowingMode": "none"},
                 "apputils-extension/notification": {"fetchNews": "false", "checkForUpdates": False}}
    for name, values in overrides.items():
        path = settings / "@jupyterlab" / f"{name}.jupyterlab-settings"
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(json.dumps(values))


@dataclass
class Lab:
    base: str  # http://127.0.0.1:PORT
    token: str
    notebook: str  # its path under the server's root
    log: Path

    @property
    def notebook_url(self) -> str:
        return f"{self.base}/lab/tree/{self.notebook}?token={self.token}"

    def kernel_idle(self) -> bool:
        """The server's session for the notebook has a kernel, and it is idle."""
        with urllib.request.urlopen(f"{self.base}/api/sessions?token={self.token}", timeout=10) as r:
            sessions = json.load(r)
        return any(s["path"] == self.notebook and s["kernel"]["execution_state"] == "idle" for s in sessions)


@pytest.fixture
def playwright_api():
    """Playwright's sync API, or a skip saying why there is no browser to drive."""
    if not CHROMIUM.exists():
        pytest.skip(f"{CHROMIUM} is missing: Chromium could not be installed (`make test-browser` installs "
                    "Debian's chromium with apt-get)")
    return pytest.importorskip("playwright.sync_api", reason="Playwright is not installed (`make test-browser` "
                               "installs it, the `browser` extra)")


@pytest.fixture
def jupyterlab(playwright_api, tmp_path):
    """JupyterLab from this venv on a free loopback port, rooted at a directory of tmp_path, with its own
    Jupyter config, data, runtime and settings directories and LAB_RESULTS_DIR, so nothing lands in the
    checkout or the user's home. Yields a `Lab`; shuts the server and its kernel down after the test.
    Started only once the browser is known to be there."""
    import psutil

    root = tmp_path / "root"
    root.mkdir()
    notebook = _prepare_notebook(root)
    _write_settings(tmp_path / "jupyter" / "settings")
    port, token = _free_port(), secrets.token_hex(16)
    env = {**os.environ,
           "LAB_RESULTS_DIR": str(tmp_path / "results"),
           "JUPYTER_CONFIG_DIR": str(tmp_path / "jupyter" / "config"),
           "JUPYTER_DATA_DIR": str(tmp_path / "jupyter" / "data"),
           "JUPYTER_RUNTIME_DIR": str(tmp_path / "jupyter" / "runtime"),
           "JUPYTERLAB_SETTINGS_DIR": str(tmp_path / "jupyter" / "settings"),
           "JUPYTERLAB_WORKSPACES_DIR": str(tmp_path / "jupyter" / "workspaces"),
           "PATH": f"{Path(sys.executable).parent}{os.pathsep}{os.environ.get('PATH', '')}"}
    cmd = [sys.executable, "-m", "jupyterlab", "--no-browser", "--ServerApp.ip=127.0.0.1",
           f"--ServerApp.port={port}", "--ServerApp.port_retries=0", f"--IdentityProvider.token={token}",
           f"--ServerApp.root_dir={root}", "--LabApp.news_url=None",
           "--LabApp.check_for_updates_class=jupyterlab.NeverCheckForUpdate", "--LabApp.extension_manager=readonly"]
    if os.geteuid() == 0:  # CI and these machines run as root
        cmd.append("--ServerApp.allow_root=True")
    log = tmp_path / "jupyterlab.log"
    base = f"http://127.0.0.1:{port}"
    started = time.monotonic()
    with open(log, "wb") as out:
        server = subprocess.Popen(cmd, cwd=root, env=env, stdout=out, stderr=subprocess.STDOUT,
                                  stdin=subprocess.DEVNULL)

    def answers():
        if server.poll() is not None:
            pytest.fail(f"JupyterLab exited with code {server.returncode} while starting; its log:\n{_tail(log)}",
                        pytrace=False)
        try:
            with urllib.request.urlopen(f"{base}/api/status?token={token}", timeout=5) as r:
                return r.status == 200
        except (urllib.error.URLError, OSError):
            return False

    try:
        _wait_for(f"JupyterLab to answer on {base}", answers, SERVER_START_S, lambda: _tail(log))
        print(f"\n[browser] JupyterLab answered on {base} after {time.monotonic() - started:.1f} s; "
              f"files in {tmp_path}")
        yield Lab(base, token, notebook.name, log)
    finally:
        # jupyter_client starts the kernel in a session of its own, out of the server's process group: it is
        # remembered by pid before the shutdown, and ended by pid if the clean shutdown (which shuts kernels
        # down first) left it behind.
        try:
            children = server.poll() is None and psutil.Process(server.pid).children(recursive=True) or []
        except psutil.Error:
            children = []
        try:
            req = urllib.request.Request(f"{base}/api/shutdown", method="POST",
                                         headers={"Authorization": f"token {token}"})
            urllib.request.urlopen(req, timeout=10).close()
        except (urllib.error.URLError, OSError):
            pass
        try:
            server.wait(SHUTDOWN_S)
        except subprocess.TimeoutExpired:
            server.terminate()
            try:
                server.wait(10)
            except subprocess.TimeoutExpired:
                server.kill()
                server.wait(10)
        for child in children:
            try:
                if child.is_running():  # is_running also checks that the pid was not reused
                    child.terminate()
                    child.wait(10)
            except psutil.TimeoutExpired:
                child.kill()
            except psutil.Error:
                pass


def test_slider_redraws_the_plot_in_jupyterlab(playwright_api, jupyterlab, tmp_path):
    t0 = time.monotonic()

    def stamp(what):
        print(f"[browser] {time.monotonic() - t0:6.1f} s  {what}")

    with playwright_api.sync_playwright() as pw:
        context = pw.chromium.launch_persistent_context(
            str(tmp_path / "chromium-profile"), executable_path=str(CHROMIUM), headless=True, args=CHROMIUM_FLAGS,
            viewport={"width": 1400, "height": 1000})
        page = context.pages[0] if context.pages else context.new_page()
        try:
            _drive(page, jupyterlab, tmp_path, stamp)
        except BaseException:
            try:
                page.screenshot(path=str(tmp_path / "failure.png"))
                print(f"[browser] failure screenshot: {tmp_path / 'failure.png'}")
            except Exception:
                pass
            raise
        finally:
            context.close()


def _drive(page, lab: Lab, tmp_path: Path, stamp):
    def notebook_errors():
        texts = page.locator(".jp-OutputArea-output[data-mime-type='application/vnd.jupyter.stderr']").all_inner_texts()
        return "\n".join(t for t in texts if ERROR_TEXT in t)

    def status():
        errors = notebook_errors()
        return (f"notebook errors:\n{errors[-3000:]}\n" if errors else "") + f"JupyterLab log (tail):\n{_tail(lab.log)}"

    def kernel_ready():
        # The toolbar's indicator reads idle before any kernel is attached ("No Kernel | Initializing" in the
        # status bar); a cell run then opens the Select Kernel dialog. Ready: the server's session for the
        # notebook has an idle kernel, and the page shows that kernel's name and the idle indicator.
        if not lab.kernel_idle():
            return False
        names = page.locator(".jp-NotebookPanel .jp-KernelName").all_inner_texts()
        return (any(n.strip() and "No Kernel" not in n for n in names) and page.locator(
            ".jp-NotebookPanel .jp-Notebook-ExecutionIndicator[data-status='idle']").count() > 0)

    page.goto(lab.notebook_url, wait_until="domcontentloaded", timeout=NOTEBOOK_OPEN_S * 1000)
    _wait_for("the notebook to open and its kernel to be idle", kernel_ready, NOTEBOOK_OPEN_S, status)
    stamp("notebook open, kernel idle")

    # Run > Run All Cells, through the menu as a person would.
    page.locator(".lm-MenuBar-item", has_text="Run").first.click()
    page.locator(".lm-Menu-item .lm-Menu-itemLabel", has_text=re.compile(r"^Run All Cells$")).click()
    stamp("Run > Run All Cells")

    widget_cell = page.locator(".jp-Notebook .jp-Cell", has=page.locator(SLIDER)).last
    images = widget_cell.locator(".jp-OutputArea img")

    def srcs():
        return images.evaluate_all("els => els.map(e => e.getAttribute('src') || '')")

    def plot_shown():
        if errors := notebook_errors():
            pytest.fail(f"a notebook cell failed:\n{errors[-3000:]}", pytrace=False)
        dialogs = page.locator(".jp-Dialog")
        if dialogs.count():  # not expected once the kernel is ready; a person would accept Python 3
            if "Select Kernel" not in dialogs.first.inner_text():
                pytest.fail(f"JupyterLab showed a dialog: {dialogs.first.inner_text()!r}", pytrace=False)
            dialogs.first.locator(".jp-mod-accept").click()
            stamp("accepted the Select Kernel dialog")
        return page.locator(SLIDER).count() > 0 and any(srcs())

    _wait_for("the run to show the slider and its first plot", plot_shown, RUN_ALL_S, status, interval=1.0)
    stamp("slider and plot shown")
    _wait_for("the run of all cells to finish (every code cell numbered, the kernel idle)",
              lambda: all(re.fullmatch(r"\[\d+\]:", t.strip()) for t in page.locator(
                  ".jp-Notebook .jp-CodeCell .jp-InputArea-prompt").all_inner_texts()) and lab.kernel_idle(),
              RUN_ALL_S, status)
    stamp("run finished")
    widget_cell.scroll_into_view_if_needed()
    slider = widget_cell.locator(SLIDER).first
    readout = slider.locator(".widget-readout")
    before, value_before = srcs(), readout.inner_text()
    page.screenshot(path=str(tmp_path / "before.png"))

    # Move the slider by keyboard on its focused handle: one step left (or right where it sits at the start).
    handle = slider.locator(HANDLE).first
    handle.focus()
    handle.press("ArrowLeft")
    if readout.inner_text() == value_before:
        handle.press("ArrowRight")
    value_after = readout.inner_text()
    assert value_after != value_before, f"the slider did not move from {value_before!r}"
    stamp(f"slider moved: {value_before} -> {value_after}")

    def redrawn():
        if errors := notebook_errors():
            pytest.fail(f"the redraw failed:\n{errors[-3000:]}", pytrace=False)
        now = srcs()
        return any(now) and now != before

    _wait_for(f"the plot to be redrawn after the slider moved to {value_after}", redrawn, REDRAW_S, status)
    stamp("plot redrawn")
    _wait_for("the kernel to be idle after the redraw", lab.kernel_idle, REDRAW_S, status)
    page.screenshot(path=str(tmp_path / "after.png"))
    assert srcs() != before
    print(f"[browser] screenshots: {tmp_path / 'before.png'}, {tmp_path / 'after.png'}")

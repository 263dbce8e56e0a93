#!/usr/bin/env python3
"""Opens stoker-server's web page in a real Chromium (driven by chromedriver over the W3C
WebDriver protocol, with nothing but the standard library) and checks it against what the test
stored: sign-in, the job list, the plotted points of a job's curves against its stored metric
history, an experiment's overlaid trials, the workers, another user's job kept out, and job
fields holding HTML shown as text. Saves a screenshot of each page.

Usage: browser_check.py EXPECT.json SCREENSHOT_DIR
EXPECT.json (written by tests/web_e2e_test.cc):
  base: "http://127.0.0.1:PORT"; token: the user's token; other_token: another team's user
  job: {id, epochs: [[epoch, step, train_loss, test_loss, test_accuracy, samples_per_second,
        data_stall_ratio, time_ms]...], steps: [[step, train_loss, samples_per_second,
        data_stall_ratio, time_ms]...]}
  experiment: {id, trials: {JOB_ID: [[epoch, test_accuracy]...]}}
  other_job: a job of another team; injected_job: a job whose error and dataset hold HTML,
  injected_text: the literal text its error must show; worker: a worker id.
Exits 0 when every check passed, 1 with the failures listed otherwise."""

import base64
import json
import os
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request

ELEMENT = "element-6066-11e4-a52e-4f735466cecf"  # the W3C element reference key
failures = []


def check(condition, what):
    print(("ok   " if condition else "FAIL ") + what, flush=True)
    if not condition:
        failures.append(what)
    return condition


class Driver:
    def __init__(self):
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            self.port = s.getsockname()[1]
        self.process = subprocess.Popen(
            ["chromedriver", f"--port={self.port}"], stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL)
        self.url = f"http://127.0.0.1:{self.port}"
        for _ in range(100):
            try:
                if self.call("GET", "/status").get("ready"):
                    break
            except (urllib.error.URLError, ConnectionError):
                pass
            time.sleep(0.1)
        # --remote-debugging-pipe: chromedriver talks to the browser over a pipe, not a TCP port
        # it reaches as "localhost" (which a root without /etc/hosts, as a fresh Debian chroot,
        # does not resolve to the browser's 127.0.0.1: "unable to connect to renderer").
        options = {"args": ["--headless=new", "--no-sandbox", "--disable-gpu",
                            "--disable-dev-shm-usage", "--hide-scrollbars",
                            "--remote-debugging-pipe", "--window-size=1300,1500"]}
        if os.path.exists("/usr/bin/chromium"):
            options["binary"] = "/usr/bin/chromium"
        session = self.call("POST", "/session", {"capabilities": {"alwaysMatch": {
            "browserName": "chrome", "acceptInsecureCerts": True,
            "goog:chromeOptions": options}}})
        self.session = session["sessionId"]

    def call(self, method, path, body=None):
        data = None if body is None else json.dumps(body).encode()
        request = urllib.request.Request(self.url + path, data=data, method=method,
                                         headers={"Content-Type": "application/json"})
        try:
            with urllib.request.urlopen(request, timeout=60) as response:
                return json.loads(response.read() or b"{}").get("value")
        except urllib.error.HTTPError as error:
            raise RuntimeError(f"webdriver {method} {path}: {error.read()[:500]!r}") from None

    def s(self, method, path, body=None):
        return self.call(method, f"/session/{self.session}{path}", body)

    def open(self, url):
        self.s("POST", "/url", {"url": url})

    def current(self):
        return self.s("GET", "/url")

    def js(self, script, *args):
        return self.s("POST", "/execute/sync", {"script": script, "args": list(args)})

    def find(self, css):
        return self.s("POST", "/element", {"using": "css selector", "value": css})[ELEMENT]

    def type(self, css, text):
        self.s("POST", f"/element/{self.find(css)}/value", {"text": text})

    def click(self, css):
        """Clicks and, as the click submits a form, waits for the next page to have loaded."""
        self.js("window.__before_click = true;")
        self.s("POST", f"/element/{self.find(css)}/click", {})
        for _ in range(200):
            if self.js("return window.__before_click === undefined && "
                       "document.readyState === 'complete';"):
                return
            time.sleep(0.05)
        raise RuntimeError(f"clicking {css} loaded no page in 10 s")

    def screenshot(self, path):
        # The whole page: the window grows to the document's height first.
        self.s("POST", "/window/rect", {"width": 1300, "height": 700})
        height = self.js("return Math.min(6000, document.querySelector('main')"
                         ".getBoundingClientRect().bottom);")
        self.s("POST", "/window/rect", {"width": 1300, "height": int(height) + 140})
        with open(path, "wb") as out:
            out.write(base64.b64decode(self.s("GET", "/screenshot")))

    def quit(self):
        try:
            self.s("DELETE", "")
        finally:
            self.process.terminate()
            self.process.wait(10)


# Reads every plotted point of a chart back as data: its polylines' pixel positions through the
# chart's own mapping (data-x0/x1/y0/y1 over the pixel box data-box).
READ_CHART = """
const svg = document.getElementById(arguments[0]);
if (!svg) return null;
const [x0, x1, y0, y1] = ['x0', 'x1', 'y0', 'y1'].map(k => parseFloat(svg.dataset[k]));
const [left, top, w, h] = svg.dataset.box.split(' ').map(parseFloat);
const out = {};
for (const g of svg.querySelectorAll('g.series')) {
  const points = g.querySelector('polyline').getAttribute('points').trim().split(/\\s+/);
  out[g.dataset.name] = points.map(p => {
    const [px, py] = p.split(',').map(parseFloat);
    return [x0 + (px - left) / w * (x1 - x0), y0 + (1 - (py - top) / h) * (y1 - y0)];
  });
}
out.__range = [x0, x1, y0, y1];
return out;
"""


def same_series(got, want, x_range, y_range, what):
    """Each plotted point within a pixel's worth (0.01 px rounding, so 0.1% of the range)."""
    if not check(got is not None and len(got) == len(want),
                 f"{what}: {len(want)} points plotted (got {None if got is None else len(got)})"):
        return
    tx = max(1e-9, abs(x_range) * 1e-3)
    ty = max(1e-9, abs(y_range) * 1e-3)
    bad = [(g, w) for g, w in zip(got, want)
           if abs(g[0] - w[0]) > tx or abs(g[1] - w[1]) > ty]
    check(not bad, f"{what}: every point equals the stored history" +
          (f" (first differing: plotted {bad[0][0]}, stored {bad[0][1]})" if bad else ""))


def main():
    expect = json.load(open(sys.argv[1]))
    shots = sys.argv[2]
    os.makedirs(shots, exist_ok=True)
    base = expect["base"]
    d = Driver()
    try:
        # Signing in.
        d.open(base + "/jobs")
        check(d.current().endswith("/login"), "a page without a session sends to the sign-in form")
        d.screenshot(os.path.join(shots, "login.png"))
        d.type("#token", "stku_" + "0" * 64)
        d.click("#sign-in")
        check("invalid bearer token" in d.js(
            "const e = document.getElementById('login-error'); return e ? e.innerText : '';"),
            "a wrong token is refused with the reason")
        d.type("#token", expect["token"])
        d.click("#sign-in")
        check(d.current().endswith("/jobs"), "signing in lands on the job list")
        check(expect["token"] not in d.current(), "the token is not in the URL")
        cookies = d.s("GET", "/cookie")
        session = [c for c in cookies if c["name"] == "stoker_session"]
        check(len(session) == 1 and session[0]["httpOnly"] and
              session[0].get("sameSite") == "Strict",
              "the session cookie is HttpOnly and SameSite=Strict")
        check(session and expect["token"] not in session[0]["value"],
              "the cookie holds a session id, not the token")
        check(d.js("return document.cookie;") == "", "page scripts cannot read the cookie")

        # The job list: the user's team's jobs, not another team's.
        listed = d.js("return [...document.querySelectorAll('#jobs tbody tr')]"
                      ".map(r => r.dataset.job);")
        check(expect["job"]["id"] in listed, "the job list shows the user's job")
        check(expect["other_job"] not in listed, "the job list leaves out another team's job")
        d.screenshot(os.path.join(shots, "jobs.png"))

        # A job's curves against its stored history.
        job = expect["job"]
        d.open(f"{base}/jobs/{job['id']}")
        loss = d.js(READ_CHART, "chart-loss")
        acc = d.js(READ_CHART, "chart-accuracy")
        thr = d.js(READ_CHART, "chart-throughput")
        stall = d.js(READ_CHART, "chart-stall")
        check(all(c is not None for c in (loss, acc, thr, stall)),
              "the job page has its four charts")
        if loss and acc and thr and stall:
            lx, ly = loss["__range"][1] - loss["__range"][0], loss["__range"][3] - loss["__range"][2]
            same_series(loss.get("train loss (epoch mean)"),
                        [[e[1], e[2]] for e in job["epochs"]], lx, ly, "epoch train loss")
            same_series(loss.get("test loss"),
                        [[e[1], e[3]] for e in job["epochs"] if e[3] >= 0], lx, ly, "test loss")
            if check(job["steps"], "the job has sampled training steps"):
                same_series(loss.get("train loss (sampled steps)"),
                            [[s[0], s[1]] for s in job["steps"]], lx, ly, "sampled step loss")
            ax, ay = acc["__range"][1] - acc["__range"][0], acc["__range"][3] - acc["__range"][2]
            same_series(acc.get("test accuracy"),
                        [[e[0], e[4]] for e in job["epochs"] if e[4] >= 0], ax, ay,
                        "test accuracy")
            timed = job["steps"] or [[e[1], e[2], e[5], e[6], e[7]] for e in job["epochs"]]
            t0 = timed[0][4]
            tx, ty = thr["__range"][1] - thr["__range"][0], thr["__range"][3] - thr["__range"][2]
            same_series(thr.get("samples/s"), [[(s[4] - t0) / 1000, s[2]] for s in timed],
                        tx, ty, "throughput")
            sx, sy = stall["__range"][1] - stall["__range"][0], stall["__range"][3] - stall["__range"][2]
            same_series(stall.get("input stall %"), [[(s[4] - t0) / 1000, 100 * s[3]] for s in timed],
                        sx, sy, "input stall")
        rows = d.js("return document.querySelectorAll('#epochs tbody tr').length;")
        check(rows == len(job["epochs"]), f"the epoch table has {len(job['epochs'])} rows")
        check(d.js("return document.querySelectorAll('#events tbody tr').length;") > 0,
              "the job page lists the job's events")
        d.screenshot(os.path.join(shots, "job.png"))

        # The experiment: one overlaid series per trial, each its stored accuracy by epoch.
        experiment = expect["experiment"]
        d.open(f"{base}/experiments/{experiment['id']}")
        overlay = d.js(READ_CHART, "chart-trials-metric")
        check(overlay is not None, "the experiment page overlays its trials")
        if overlay:
            rx = overlay["__range"][1] - overlay["__range"][0]
            ry = overlay["__range"][3] - overlay["__range"][2]
            for job_id, points in experiment["trials"].items():
                name = next((n for n in overlay if n.endswith(f"({job_id})")), None)
                check(name is not None, f"trial {job_id} has a curve")
                if name:
                    same_series(overlay[name], points, rx, ry, f"trial {job_id} accuracy")
        trial_rows = d.js("return document.querySelectorAll('#trials tbody tr').length;")
        check(trial_rows == len(experiment["trials"]),
              f"the comparison table has {len(experiment['trials'])} trials")
        d.screenshot(os.path.join(shots, "experiment.png"))

        # Workers.
        d.open(base + "/workers")
        check(expect["worker"] in d.js("return document.getElementById('workers').innerText;"),
              "the workers page lists the worker")
        d.screenshot(os.path.join(shots, "workers.png"))

        # Another team's job is not found, and nothing of it shows.
        d.open(f"{base}/jobs/{expect['other_job']}")
        text = d.js("return document.body.innerText;")
        check("Not found" in text and expect["other_name"] not in text,
              "another team's job page answers not found and shows nothing of it")

        # HTML in a job's fields is shown as text: no element made of it, no script run.
        d.open(f"{base}/jobs/{expect['injected_job']}")
        error = d.js("const e = document.getElementById('job-error'); return e ? e.innerText : '';")
        check(expect["injected_text"] in error, "the error's HTML shows as text")
        check(d.js("return document.querySelectorAll('img, script, [onload], [onerror]').length;")
              == 0, "no element was made of the job's fields")
        check(d.js("return window.pwned === undefined;"), "no injected script ran")
        d.screenshot(os.path.join(shots, "injected.png"))
        d.open(f"{base}/experiments/{expect['injected_experiment']}")
        check(d.js("return document.querySelectorAll('img, script, [onload], [onerror]').length;")
              == 0 and d.js("return window.pwned === undefined;"),
              "an experiment whose values hold HTML shows them as text")
        check(expect["injected_value"] in d.js("return document.body.innerText;"),
              "the HTML value shows literally in the comparison")

        # Signing out ends the session.
        d.open(base + "/jobs")
        d.click("nav .signout button")
        check(d.current().endswith("/login"), "signing out returns to the sign-in form")
        d.open(base + "/jobs")
        check(d.current().endswith("/login"), "after signing out the pages need a sign-in again")
    finally:
        d.quit()
    if failures:
        print(f"{len(failures)} check(s) failed", flush=True)
        return 1
    print("every browser check passed", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())

#!/usr/bin/env python3
"""Times the web page's job list (stoker-server --web-listen) as a browser fetches it: signs in
with a token through the form, then fetches the first page, walks the "older" links page after
page, and fetches a page deep in the list, a state filter and a job page, each several times.
Prints key=value lines: per kind, p50/p95/max milliseconds from the request to the last byte.

Usage: web_pages.py BASE_URL TOKEN_FILE LABEL [--walk 40] [--repeat 20] [--all]"""

import argparse
import http.client
import re
import statistics
import time
import urllib.parse


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("base")
    parser.add_argument("token_file")
    parser.add_argument("label")
    parser.add_argument("--walk", type=int, default=40)
    parser.add_argument("--repeat", type=int, default=20)
    parser.add_argument("--all", action="store_true", help="every team's jobs (cluster admins)")
    args = parser.parse_args()
    url = urllib.parse.urlparse(args.base)
    conn = http.client.HTTPConnection(url.hostname, url.port, timeout=30)

    def fetch(path, body=None, cookie=None):
        headers = {"Cookie": cookie} if cookie else {}
        if body is not None:
            headers["Content-Type"] = "application/x-www-form-urlencoded"
        t0 = time.perf_counter()
        conn.request("POST" if body is not None else "GET", path, body=body, headers=headers)
        response = conn.getresponse()
        data = response.read()
        return response, data.decode(), (time.perf_counter() - t0) * 1000

    token = open(args.token_file).read().strip()
    response, _, _ = fetch("/login", body=urllib.parse.urlencode({"token": token}))
    cookie = response.getheader("Set-Cookie", "").split(";")[0]
    if response.status != 303 or not cookie:
        raise SystemExit(f"sign-in failed: {response.status}")

    first = "/jobs?all=1" if args.all else "/jobs"
    times = {"first": [], "walk": [], "deep": [], "state": [], "job": []}
    rows = 0
    for _ in range(args.repeat):
        _, page, ms = fetch(first, cookie=cookie)
        times["first"].append(ms)
    rows = page.count("<tr data-job=")
    first_job = re.search(r'<tr data-job="([^"]+)"', page).group(1)
    path, pages = first, 0
    last_cursor = None
    while pages < args.walk:
        response, page, ms = fetch(path, cookie=cookie)
        if response.status != 200:
            raise SystemExit(f"{path}: {response.status}")
        times["walk"].append(ms)
        pages += 1
        older = re.search(r'id="older" href="([^"]+)"', page)
        if not older:
            break
        path = older.group(1).replace("&amp;", "&")
        last_cursor = path
    for _ in range(args.repeat):
        times["deep"].append(fetch(last_cursor or "/jobs", cookie=cookie)[2])
        times["state"].append(fetch(first + ("&" if args.all else "?") + "state=queued",
                                    cookie=cookie)[2])
        times["job"].append(fetch(f"/jobs/{first_job}", cookie=cookie)[2])

    def q(values, p):
        values = sorted(values)
        return values[min(len(values) - 1, int(p * len(values)))]

    print(f"web_pages {args.label} rows_per_page={rows} pages_walked={pages} " +
          " ".join(f"{k}_p50_ms={statistics.median(v):.1f} {k}_p95_ms={q(v, 0.95):.1f} "
                   f"{k}_max_ms={max(v):.1f}" for k, v in times.items()))


if __name__ == "__main__":
    main()

#!/usr/bin/env python3
"""Drives headless Chromium through ds4-server's chat page (tests/chat_page.rs).

Chromium is steered over its DevTools protocol on --remote-debugging-pipe:
JSON messages separated by NUL bytes on file descriptors 3 (to Chromium) and
4 (from it). That needs nothing but the Python standard library and the
system's `chromium` (no WebSocket client, no Playwright driver to install).

usage: drive.py CHROMIUM URL API_KEY SCREENSHOT.png
Prints one JSON object of what the page showed; the Rust test judges it.
Besides SCREENSHOT.png it keeps one screenshot per feature of issue 39,
SCREENSHOT_<feature>.png (stats, regenerate, edit, chats, markdown).
Every wait is bounded; Chromium is closed (or killed) on every path.
"""

import base64
import fcntl
import json
import os
import select
import shutil
import subprocess
import sys
import tempfile
import time

DEADLINE = time.monotonic() + 120


class Browser:
    def __init__(self, chromium):
        self.profile = tempfile.mkdtemp(prefix="ds4-chromium-")
        to_r, self.to_w = os.pipe()
        self.from_r, from_w = os.pipe()

        def child_fds():
            # Move both ends above the standard numbers, then onto 3 and 4.
            a = fcntl.fcntl(to_r, fcntl.F_DUPFD, 10)
            b = fcntl.fcntl(from_w, fcntl.F_DUPFD, 10)
            os.dup2(a, 3)
            os.dup2(b, 4)

        args = [
            chromium,
            "--headless",
            "--remote-debugging-pipe",
            "--no-sandbox",  # CI runs as root
            "--disable-gpu",
            "--disable-dev-shm-usage",
            "--no-first-run",
            "--no-default-browser-check",
            "--disable-extensions",
            "--disable-background-networking",
            "--disable-component-update",
            "--disable-sync",
            "--window-size=1100,800",
            f"--user-data-dir={self.profile}",
            "about:blank",
        ]
        self.proc = subprocess.Popen(
            args,
            preexec_fn=child_fds,
            pass_fds=(3, 4),
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
        os.close(to_r)
        os.close(from_w)
        self.buf = b""
        self.next_id = 0
        self.events = []
        self.session = None

    def close(self):
        try:
            if self.proc.poll() is None:
                try:
                    self.call("Browser.close", timeout=5)
                except Exception:
                    pass
                try:
                    self.proc.wait(timeout=5)
                except subprocess.TimeoutExpired:
                    self.proc.kill()
                    self.proc.wait(timeout=5)
        finally:
            shutil.rmtree(self.profile, ignore_errors=True)

    def _read_message(self, until):
        while b"\0" not in self.buf:
            left = min(until, DEADLINE) - time.monotonic()
            if left <= 0:
                raise TimeoutError("no answer from Chromium in time")
            ready, _, _ = select.select([self.from_r], [], [], left)
            if not ready:
                continue
            chunk = os.read(self.from_r, 1 << 16)
            if not chunk:
                raise RuntimeError("Chromium closed the pipe")
            self.buf += chunk
        msg, _, self.buf = self.buf.partition(b"\0")
        return json.loads(msg)

    def call(self, method, params=None, timeout=30, session=True):
        self.next_id += 1
        msg = {"id": self.next_id, "method": method, "params": params or {}}
        if session and self.session:
            msg["sessionId"] = self.session
        os.write(self.to_w, json.dumps(msg).encode() + b"\0")
        until = time.monotonic() + timeout
        while True:
            m = self._read_message(until)
            if m.get("id") == self.next_id:
                if "error" in m:
                    raise RuntimeError(f"{method}: {m['error']}")
                return m.get("result", {})
            if "method" in m:
                self.events.append(m)

    def js(self, expr):
        r = self.call(
            "Runtime.evaluate",
            {"expression": expr, "returnByValue": True, "awaitPromise": True},
        )
        if "exceptionDetails" in r:
            raise RuntimeError(f"{expr}: {r['exceptionDetails']}")
        return r["result"].get("value")

    def wait(self, expr, timeout=60):
        """Polls `expr` until it is truthy; returns its value."""
        until = time.monotonic() + timeout
        while time.monotonic() < min(until, DEADLINE):
            v = self.js(expr)
            if v:
                return v
            time.sleep(0.05)
        raise TimeoutError(f"never true: {expr}")

    def type_text(self, element_id, text):
        self.js(f"document.getElementById({json.dumps(element_id)}).focus()")
        self.call("Input.insertText", {"text": text})

    def press_enter(self):
        for kind in ("keyDown", "keyUp"):
            self.call(
                "Input.dispatchKeyEvent",
                {"type": kind, "key": "Enter", "code": "Enter", "windowsVirtualKeyCode": 13},
            )



def last_answer(b):
    return b.js(
        f"""(() => {{ const a = [...document.querySelectorAll('.assistant')].pop();
        if (!a) return null;
        const d = a.querySelector('details');
        return {{state: a.dataset.state || '', chunks: +(a.dataset.chunks || 0),
                 text: a.querySelector('.text').textContent,
                 reasoning: d.textContent.replace(/^Thinking/, ''),
                 reasoning_shown: !d.hidden, reasoning_open: d.open,
                 status: a.querySelector('.status').textContent,
                 prompt: a.dataset.prompt, cached: a.dataset.cached,
                 generated: a.dataset.generated, tps: a.dataset.tps}}; }})()"""
    )


def settled(b):
    b.wait(
        "(() => { const a = [...document.querySelectorAll('.assistant')].pop();"
        " return a && ['done', 'error', 'stopped'].includes(a.dataset.state); })()"
    )
    return last_answer(b)


def count(b, selector):
    return b.js(f"document.querySelectorAll({json.dumps(selector)}).length")


def stored(b):
    """The conversations as the page keeps them, and the open one's id."""
    return b.js(
        "({chats: JSON.parse(localStorage.getItem('ds4.chats') || '[]'),"
        " current: localStorage.getItem('ds4.current')})"
    )


def reload(b):
    b.call("Page.reload")
    time.sleep(0.2)
    b.wait("document.readyState === 'complete' && !!document.getElementById('send')")


def screenshot(b, path):
    data = b.call("Page.captureScreenshot", {"format": "png"})["data"]
    with open(path, "wb") as f:
        f.write(base64.b64decode(data))


# An answer with markdown, put in storage as if the model had written it:
# the tiny test model writes noise, never markdown.
MARKDOWN = (
    "# Title\n\nSome **bold**, *italic* and `x < y`.\n\n"
    "```python\nprint(1 < 2)\n```\n\n- one\n- two\n\n"
    "<img src=x onerror=\"document.title='pwned'\">"
)


def main():
    chromium, url, key, shot = sys.argv[1:5]
    stem = shot[:-4] if shot.endswith(".png") else shot
    b = Browser(chromium)
    out = {}
    try:
        target = b.call("Target.createTarget", {"url": "about:blank"}, session=False)
        att = b.call(
            "Target.attachToTarget",
            {"targetId": target["targetId"], "flatten": True},
            session=False,
        )
        b.session = att["sessionId"]
        b.call("Network.enable")
        b.call("Page.enable")
        b.call("Page.navigate", {"url": url})
        b.wait("document.readyState === 'complete' && !!document.getElementById('send')")
        out["title"] = b.js("document.title")

        # 1. No key: the server refuses, the page says why.
        b.type_text("input", "Hello without a key")
        b.press_enter()
        out["without_key"] = settled(b)

        # 2. The key, thinking off: a streamed answer.
        b.type_text("key", key)
        b.js("document.getElementById('think').checked = false")
        b.js("document.getElementById('max').value = '24'")
        b.type_text("input", "Say hello")
        b.press_enter()
        out["answer"] = settled(b)
        screenshot(b, f"{stem}_stats.png")
        # The model's name and context, from /v1/models once the key is in.
        b.wait("!!document.getElementById('model').dataset.ctx", timeout=10)
        out["model"] = b.js(
            "(() => { const m = document.getElementById('model');"
            " return {text: m.textContent, id: m.dataset.id, ctx: m.dataset.ctx}; })()"
        )

        # 3. Thinking on: the reasoning streams into a folded block.
        b.js("document.getElementById('think').checked = true")
        b.type_text("input", "Think first")
        b.press_enter()
        out["thinking"] = settled(b)

        # 4. A long answer stopped by the Stop button once it streams.
        b.js("document.getElementById('think').checked = false")
        b.js("document.getElementById('max').value = '100000'")
        b.type_text("input", "Go on and on")
        b.press_enter()
        b.wait(f"(() => {{ const a = [...document.querySelectorAll('.assistant')].pop();"
               f" return a && +(a.dataset.chunks || 0) >= 2; }})()")
        b.js("document.getElementById('stop').click()")
        out["stopped"] = settled(b)
        out["buttons_after_stop"] = b.js(
            "[document.getElementById('send').disabled, document.getElementById('stop').disabled]"
        )

        screenshot(b, shot)

        # 5. Regenerate the stopped answer (short this time): it replaces it.
        b.js("document.getElementById('max').value = '24'")
        # (Counted in storage: the refused first answer was never kept.)
        answers_before = len(stored(b)["chats"][0]["messages"])
        b.js("document.querySelector('.regen').click()")
        regen = settled(b)
        msgs = stored(b)["chats"][0]["messages"]
        regen["answers_before"] = answers_before
        regen["answers_after"] = len(msgs)
        regen["shown"] = count(b, ".assistant")
        regen["stored_last"] = msgs[-1]
        out["regenerate"] = regen
        screenshot(b, f"{stem}_regenerate.png")

        # 6. Edit the last question: it goes back into the input with its
        #    answer dropped, and is sent again from there.
        users_before = count(b, ".user")
        b.js("document.querySelector('.edit').click()")
        edit = {
            "users_before": users_before,
            "users_after_click": count(b, ".user"),
            "input": b.js("document.getElementById('input').value"),
        }
        screenshot(b, f"{stem}_edit.png")
        b.js("document.getElementById('input').value += ' (edited)'")
        b.js("document.getElementById('input').focus()")
        b.press_enter()
        edit["answer"] = settled(b)
        edit["users_after_send"] = count(b, ".user")
        msgs = stored(b)["chats"][0]["messages"]
        edit["stored_roles"] = [m["role"] for m in msgs]
        edit["stored_last_question"] = msgs[-2]["content"]
        out["edit"] = edit

        # 7. Conversations: a new chat, a switch back, a reload keeps both.
        first = stored(b)["current"]
        first_users = count(b, ".user")
        b.js("document.getElementById('new').click()")
        chats = {"log_after_new": count(b, "#log .msg"), "listed_after_new": count(b, "#chats li")}
        b.type_text("input", "Second chat")
        b.press_enter()
        chats["second_answer"] = settled(b)["state"]
        b.js(f"document.querySelector('#chats li[data-id={json.dumps(first)}] span').click()")
        chats["users_after_switch"] = count(b, ".user")
        chats["first_users"] = first_users
        reload(b)
        st = stored(b)
        chats["after_reload"] = {
            "listed": count(b, "#chats li"),
            "users": count(b, ".user"),
            "current": st["current"] == first,
            "titles": [c["title"] for c in st["chats"]],
        }
        screenshot(b, f"{stem}_chats.png")
        out["chats"] = chats

        # 8. Markdown: a stored answer rendered, with a copy button that copies.
        b.call(
            "Browser.grantPermissions",
            {"permissions": ["clipboardReadWrite", "clipboardSanitizedWrite"],
             "origin": url.rstrip("/")},
            session=False,
        )
        b.js(
            "(() => { const all = JSON.parse(localStorage.getItem('ds4.chats'));"
            " all.unshift({id: 'md', title: 'Markdown', messages: ["
            " {role: 'user', content: 'Show code'},"
            f" {{role: 'assistant', content: {json.dumps(MARKDOWN)}}}]}});"
            " localStorage.setItem('ds4.chats', JSON.stringify(all));"
            " localStorage.setItem('ds4.current', 'md'); })()"
        )
        reload(b)
        md = b.js(
            "(() => { const t = document.querySelector('.assistant .text');"
            " return {h1: (t.querySelector('h1') || {}).textContent,"
            " strong: (t.querySelector('strong') || {}).textContent,"
            " em: (t.querySelector('em') || {}).textContent,"
            " inline_code: (t.querySelector('p code') || {}).textContent,"
            " code: (t.querySelector('pre code') || {}).textContent,"
            " label: (t.querySelector('.codebar span') || {}).textContent,"
            " items: t.querySelectorAll('li').length, copy_buttons: t.querySelectorAll('.copy').length,"
            " images: t.querySelectorAll('img').length, title: document.title,"
            " raw_tag_shown: t.textContent.includes('<img src=x')}; })()"
        )
        b.js("document.querySelector('.copy').click()")
        md["copied"] = b.wait("document.querySelector('.copy').dataset.copied", timeout=10)
        md["clipboard"] = b.js("navigator.clipboard.readText().catch((e) => 'error: ' + e)")
        screenshot(b, f"{stem}_markdown.png")
        out["markdown"] = md
        out["requests"] = sorted(
            {
                e["params"]["request"]["url"]
                for e in b.events
                if e.get("method") == "Network.requestWillBeSent"
            }
        )
    finally:
        b.close()
    print(json.dumps(out))


if __name__ == "__main__":
    main()

"""
tupper.code_interpreter against a real daemon and the shipped
code-interpreter recipe: variables persist, logs and callbacks, errors with
tracebacks, a matplotlib PNG, a DataFrame's html, contexts, a timeout that
interrupts a cell and leaves its context usable, bad input refused; the
asyncio form too.

The recipe's first build takes minutes, so the tests that need it run when
TUPPER_CODE_SOCKET names a daemon that has it (or builds it once):
tests/slow/code_interpreter_spec.lua runs this file so.  The others run
against the session's private daemon in every run.
"""
import asyncio
import base64
import os
import time

import pytest

from tupper import InvalidArgumentException, NotFoundException, SandboxException, TimeoutException
from tupper import Sandbox as BaseSandbox
from tupper.code_interpreter import CODE_MAX_BYTES, AsyncSandbox, Context, Execution, Sandbox

SHARED = os.environ.get("TUPPER_CODE_SOCKET")
needs_recipe = pytest.mark.skipif(not SHARED, reason="needs TUPPER_CODE_SOCKET (tests/slow/code_interpreter_spec.lua)")
PNG_MAGIC = b"\x89PNG\r\n\x1a\n"


@pytest.fixture
def plain(opts):
    """A code interpreter Sandbox of the embedded busybox image: no python3, no driver."""
    s = Sandbox.create(template="default", **opts)
    try:
        yield s
    finally:
        s.kill()


def test_bad_input_is_refused_before_anything_runs(plain):
    assert isinstance(plain, BaseSandbox)
    with pytest.raises(InvalidArgumentException, match="at most 1048576 bytes"):
        plain.run_code("x" * (CODE_MAX_BYTES + 1))
    with pytest.raises(InvalidArgumentException):
        plain.run_code(42)
    with pytest.raises(InvalidArgumentException, match="not both"):
        plain.run_code("1", language="python", context=Context("x", "python", "/"))
    with pytest.raises(InvalidArgumentException):
        plain.run_code("1", timeout=-1)
    with pytest.raises(InvalidArgumentException):
        plain.remove_code_context("")


def test_a_sandbox_without_the_driver_says_how_to_get_one(plain):
    with pytest.raises(SandboxException, match="code-interpreter recipe"):
        plain.run_code("1 + 1")
    assert plain.commands.list() == []


@pytest.fixture(scope="module")
def ci():
    s = Sandbox.create(socket=SHARED)
    try:
        yield s
    finally:
        sid = s.sandbox_id
        s.kill()
        with pytest.raises(NotFoundException):
            BaseSandbox.get_info(sid, socket=SHARED)


@needs_recipe
def test_variables_persist_and_the_value_is_the_main_result(ci):
    a = ci.run_code("x = 6 * 7\nx")
    assert isinstance(a, Execution)
    assert a.error is None
    assert a.text == "42"
    assert a.results[0].is_main_result
    b = ci.run_code("x + 1")
    assert b.text == "43"
    assert b.execution_count == a.execution_count + 1
    assert '"43"' in b.to_json()


@needs_recipe
def test_logs_and_callbacks(ci):
    out, err = [], []
    e = ci.run_code('import sys, time\nprint("one")\ntime.sleep(0.3)\nprint("two", file=sys.stderr)\nprint("three")',
                    on_stdout=out.append, on_stderr=err.append)
    assert "".join(e.logs.stdout) == "one\nthree\n"
    assert "".join(e.logs.stderr) == "two\n"
    assert "".join(m.line for m in out) == "one\nthree\n"
    assert err[0].error and not out[0].error
    assert e.text is None


@needs_recipe
def test_an_error_has_name_value_traceback_and_the_context_goes_on(ci):
    seen = []
    e = ci.run_code('def f():\n    raise ValueError("bad thing")\nf()', on_error=seen.append)
    assert e.error.name == "ValueError"
    assert e.error.value == "bad thing"
    assert "in f" in e.error.traceback and "\x1b[" not in e.error.traceback
    assert seen[0].name == "ValueError"
    assert ci.run_code("x").text == "42"


@needs_recipe
def test_a_matplotlib_plot_is_a_png_and_a_dataframe_is_html(ci):
    e = ci.run_code("import matplotlib.pyplot as plt\nplt.plot([1, 2, 3])\nplt.show()")
    assert e.error is None, e.error
    pngs = [r for r in e.results if r.png]
    assert pngs, [r.formats() for r in e.results]
    assert base64.b64decode(pngs[0].png)[:8] == PNG_MAGIC
    assert "png" in pngs[0].formats()
    d = ci.run_code('import pandas as pd\npd.DataFrame({"a": [1, 2], "b": ["x", "y"]})')
    assert "<table" in d.results[0].html
    assert "a" in d.results[0].text and "html" in d.results[0].formats()


@needs_recipe
def test_envs_are_set_for_the_cell_only(ci):
    assert ci.run_code('import os\nos.environ.get("GREETING")', envs={"GREETING": "hi"}).text == "'hi'"
    assert ci.run_code('import os\nos.environ.get("GREETING")').text is None


@needs_recipe
def test_a_cell_past_its_timeout_is_interrupted_and_the_context_stays(ci):
    ci.run_code('kept = "still here"')
    t0 = time.monotonic()
    with pytest.raises(TimeoutException, match="interrupted"):
        ci.run_code("while True:\n    pass", timeout=2)
    took = time.monotonic() - t0
    assert 2 <= took < 10, took  # near its timeout, with room for a loaded host
    assert ci.run_code("kept").text == "'still here'"


@needs_recipe
def test_contexts(ci):
    ctx = ci.create_code_context(cwd="/tmp")
    assert ctx.language == "python" and ctx.cwd == "/tmp"
    assert ci.run_code("import os\nos.getcwd()", context=ctx).text == "'/tmp'"
    assert ci.run_code("x", context=ctx).error.name == "NameError"
    ci.run_code("y = 5", context=ctx)
    ids = [c.id for c in ci.list_code_contexts()]
    assert ctx.id in ids and "default" in ids
    ci.restart_code_context(ctx)
    assert ci.run_code("y", context=ctx).error.name == "NameError"
    ci.remove_code_context(ctx.id)
    assert ctx.id not in [c.id for c in ci.list_code_contexts()]
    with pytest.raises(NotFoundException, match="no code context"):
        ci.run_code("1", context=ctx)
    with pytest.raises(NotFoundException):
        ci.remove_code_context(ctx)


@needs_recipe
def test_bad_input_in_the_sandbox(ci):
    with pytest.raises(InvalidArgumentException, match="not supported"):
        ci.run_code("1", language="cobol")
    with pytest.raises(InvalidArgumentException):
        ci.create_code_context(language="r")
    with pytest.raises(NotFoundException):
        ci.create_code_context(cwd="/no/such/dir")
    big = ci.run_code('for i in range(300000):\n    print("0123456789")')
    text = "".join(big.logs.stdout)
    assert len(text) < (1 << 20) + 200 and "output truncated" in text
    assert ci.run_code("x").text == "42"


@needs_recipe
def test_async_sandbox():
    async def go():
        s = await AsyncSandbox.create(socket=SHARED)
        try:
            seen = []

            async def on_stdout(m):
                seen.append(m.line)

            e = await s.run_code('v = 2 ** 10\nprint("hey")\nv', on_stdout=on_stdout)
            assert e.text == "1024" and seen == ["hey\n"]
            assert (await s.run_code("v + 1")).text == "1025"
            with pytest.raises(TimeoutException):
                await s.run_code("while True: pass", timeout=1)
            assert (await s.run_code("v")).text == "1024"
            ctx = await s.create_code_context()
            assert ctx.id in [c.id for c in await s.list_code_contexts()]
            await s.remove_code_context(ctx)
            with pytest.raises(NotFoundException):
                await s.restart_code_context(ctx)
        finally:
            await s.kill()

    asyncio.run(go())

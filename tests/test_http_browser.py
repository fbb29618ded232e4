"""The playground page at `/` in a real headless Chromium (Debian's /usr/bin/chromium, driven by
playwright; no browser download), against a real difflet-runtime serving flux-tiny.

Oracle: the image the page shows is the served PNG (its data URL decodes to the same bytes the
gRPC route returns for the prompt, seed and steps typed), at the served size; the page showed
every step's progress; a bad field shows the server's error text.
"""
from __future__ import annotations

import base64

import pytest

from difflet.runtime import client as grpc_client
from difflet.runtime.demo import stop_server
from http_util import start_http_server

WAIT_MS = 300_000  # generous: a loaded 2-core machine


@pytest.fixture(scope="module")
def server(flux_tiny_art):
    proc, grpc_address, http_address = start_http_server(flux_tiny_art)
    yield grpc_address, http_address
    assert stop_server(proc) == 0


def test_playground_generates_with_live_progress_and_shows_errors(server, page, tmp_path):
    grpc_address, http_address = server
    page.set_default_timeout(WAIT_MS)
    page.goto(f"http://{http_address}/")
    page.wait_for_function("document.getElementById('size').options.length > 0")
    assert page.input_value("#size") == "32x32" and page.input_value("#steps") == "4"
    # record every status line the page shows (the progress lives there and in <progress>)
    page.evaluate("""() => { window.seen = [];
        new MutationObserver(() => window.seen.push(
            [document.getElementById('status').textContent, document.getElementById('progress').value]))
          .observe(document.getElementById('status'), {childList: true, characterData: true, subtree: true}); }""")
    page.fill("#prompt", "a red fox in the snow")
    page.fill("#steps", "3")
    page.fill("#seed", "11")
    page.click("#generate")
    page.wait_for_function("document.querySelector('#result') && document.querySelector('#result').complete"
                           " && document.querySelector('#result').naturalWidth > 0")
    size = page.evaluate("[document.querySelector('#result').naturalWidth, document.querySelector('#result').naturalHeight]")
    assert size == [32, 32]
    seen = page.evaluate("window.seen")
    steps = [text for text, _ in seen if text.startswith("step ")]
    assert [s for s in steps if s != "step 0/0"] == ["step 1/3", "step 2/3", "step 3/3"], seen
    assert [value for text, value in seen if text == "step 2/3"] == [67]
    src = page.get_attribute("#result", "src")
    assert base64.b64decode(src.split(",", 1)[1]) == \
        grpc_client.generate(grpc_address, "a red fox in the snow", 11, steps=3, timeout=300).png
    page.screenshot(path=str(tmp_path / "playground.png"), full_page=True)
    assert (tmp_path / "playground.png").stat().st_size > 0

    # a bad field: lift the input's own min check so the server's 400 is what the page shows
    page.evaluate("document.getElementById('steps').removeAttribute('min')")
    page.fill("#steps", "0")
    page.click("#generate")
    page.wait_for_function("document.getElementById('error').textContent.length > 0")
    assert page.text_content("#error") == "error: 400: num_inference_steps: 0 is outside [1, 1000]"
    assert page.query_selector("#result") is None
    page.screenshot(path=str(tmp_path / "playground-error.png"), full_page=True)

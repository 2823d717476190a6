"""The playground page at / of a real `kiln serve`, driven in headless Chromium: type, run, read the answers."""

from __future__ import annotations

import shutil
import sys

import pytest

import kiln
from kiln.data.texts import builtin_pairs
from kiln.serving import process
from kiln.tasks import TaskName, TextPair

pytestmark = pytest.mark.browser
CHROMIUM = shutil.which("chromium")


def test_two_models_answer_a_pair_side_by_side(task_artifacts, tmp_path):
    if CHROMIUM is None:
        pytest.skip("chromium is not installed (make test installs Debian's chromium when it runs as root)")
    from playwright.sync_api import sync_playwright

    from kiln.choices import ExportFormat
    from kiln.exporting.job import ExportConfig, run_export

    onnx = task_artifacts[TaskName.TEXT_CLASSIFICATION]
    model_dir = kiln.Artifact.open(onnx).manifest.source.path
    scripted = tmp_path / "ts"
    run_export(ExportConfig(model=model_dir, task=TaskName.TEXT_CLASSIFICATION, format=ExportFormat.TORCHSCRIPT,
                            output=scripted))
    proc, port = process.start_server([sys.executable, "-m", "kiln", "serve", "--model", f"onnx={onnx}",
                                       "--model", f"torchscript={scripted}"])
    a, b = builtin_pairs(3, seed=4)[1]
    try:
        with sync_playwright() as pw:
            browser = pw.chromium.launch(executable_path=CHROMIUM, args=["--no-sandbox", "--disable-gpu"])
            page = browser.new_page()
            errors: list[str] = []
            page.on("pageerror", lambda err: errors.append(str(err)))
            page.goto(f"http://127.0.0.1:{port}/")
            form = page.locator('form[data-task="text-classification"]')
            form.locator('[name="text"]').fill(a)
            form.locator('[name="text_pair"]').fill(b)
            page.locator('[data-validation="onnx"]').filter(has_text="onnx-fp32").wait_for(timeout=30_000)
            form.locator("button").click()
            page.locator('.answer[data-model="torchscript"][data-done="1"]').wait_for(timeout=60_000)
            cards = {name: page.locator(f'.answer[data-model="{name}"]') for name in ("onnx", "torchscript")}
            shown = {name: card.locator("pre").inner_text() for name, card in cards.items()}
            meta = cards["onnx"].locator(".meta").inner_text()
            page.screenshot(path=str(tmp_path / "playground.png"), full_page=True)
            browser.close()
    finally:
        proc.terminate()
        proc.wait(timeout=60)
    assert errors == []
    expected = kiln.load(onnx).predict([TextPair(a, b)])[0][0]
    for name, text in shown.items():
        assert expected.label in text, (name, text)  # both models' answers, read back from the page
    assert meta.startswith("server ") and " ms · round trip " in meta

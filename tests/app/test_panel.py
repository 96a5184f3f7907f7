"""The live panel: folding a stream recorded from the demo model and one built here, the
cache map's colours, recall@k per horizon, sampling only while visible, NVML missing or
failing, and exporting the figures."""

from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path

import numpy as np
import pytest
from PySide6.QtCore import QEvent, QPoint
from PySide6.QtGui import QColor, QHelpEvent, QImage
from PySide6.QtWidgets import QApplication, QToolTip
from seqmoe import Engine, Sampling, load_model
from seqmoe.events import (
    CacheSnapshot,
    EventBuffer,
    ExpertEvicted,
    ExpertsForecast,
    LayerRouted,
    PrefetchCancelled,
    PrefetchIssued,
    SlotStatus,
    Stall,
    TokenGenerated,
)
from seqmoe.resources import demo_model_dir

from seqmoe_chat.panel import memory_monitor
from seqmoe_chat.panel.cache_map import STATE_COLOURS
from seqmoe_chat.panel.counters import CountersView
from seqmoe_chat.panel.forecast_view import NO_FORECAST_COLOUR, ForecastView
from seqmoe_chat.panel.layer_grid import LayerGrid
from seqmoe_chat.panel.memory_monitor import NO_NVML, MemoryMonitor, MemorySample
from seqmoe_chat.panel.memory_view import Segment, StackedBar
from seqmoe_chat.panel.telemetry_model import CELL_STATES, TelemetryModel
from seqmoe_chat.store.records import DONE
from seqmoe_chat.theme import apply_theme
from seqmoe_chat.worker import model_info

from .test_chat import send, stored, wait_idle
from .waits import model_shown

PROMPT = "Tell me about the mountains you like to hike."


@pytest.fixture(scope="module")
def recorded():
    """A real stream: the demo model with the seqmoe policy on a slow emulated link, so that
    there are prefetches, misses and stalls."""
    engine = Engine(load_model(str(demo_model_dir()), device="cpu"), link_gbps=0.05)
    engine.configure("seqmoe", cache_ratio=0.3)
    buffer = EventBuffer()
    engine.events.subscribe(buffer)
    result = engine.generate(engine.encode(PROMPT, chat=True), Sampling(max_new_tokens=12))
    info = model_info(engine)
    engine.close()
    return buffer.drain(), info, result.stats


def test_the_folded_stream_agrees_with_the_engine_statistics(recorded) -> None:
    events, info, stats = recorded
    model = TelemetryModel(info.num_layers, info.experts_per_layer, info.bytes_per_copy)
    # Folded in uneven batches, as the timer drains them.
    for start in range(0, len(events), 97):
        model.fold(events[start:start + 97])
    counters = model.counters
    assert model.generations == 1
    assert (counters.tokens, counters.hits, counters.misses) == (stats.tokens, stats.hits, stats.misses)
    assert (counters.decode_hits, counters.decode_misses) == (stats.decode_hits, stats.decode_misses)
    assert counters.decode_hit_rate == pytest.approx(stats.decode_hit_rate) and counters.decode_tokens_per_s > 0
    # Packed experts differ in size by the few weights each keeps whole: the mean is within a hair.
    assert counters.copies * info.bytes_per_copy == pytest.approx(stats.h2d_bytes, rel=0.01)
    assert counters.prefetch_copies == stats.prefetch_issued and counters.prefetch_unused == stats.prefetch_unused
    assert counters.stall_seconds == pytest.approx(stats.stall_seconds, rel=1e-6)
    assert sum(model.stall_per_token) == pytest.approx(stats.stall_seconds, rel=1e-6)
    assert len(model.stall_per_token) == stats.tokens
    assert sorted(model.recall) == list(range(1, info.predictor_horizon + 1))
    assert all(0 < tally.recall <= 1 for tally in model.recall.values())
    assert 0 < counters.prefetch_precision <= 1
    # The last snapshot is the pool as the reply left it: every slot holds an expert, none in use.
    cells = model.cell_counts()
    assert cells["ready"] + cells["loading"] == info.cache_slots and cells["in use"] == 0
    summary = json.loads(json.dumps(model.summary()))
    assert summary["counters"]["tokens"] == stats.tokens


def test_the_replys_speed_and_hit_rate_are_those_of_generating_with_the_prompts_apart(qtbot) -> None:
    model = TelemetryModel(num_layers=2, num_experts=4, bytes_per_copy=10)
    view = CountersView()
    qtbot.addWidget(view)
    # The prompt misses all three experts it routes (0.5 s), then two decode tokens in 0.1 s hit 2 of 4:
    # one is missed, and one is found on its way (a prefetch not landed), which is no hit either.
    model.fold([LayerRouted(0, (0, 1), (0, 1), True), LayerRouted(1, (2,), (2,), True), TokenGenerated(0, 7, 0.5),
                LayerRouted(0, (0,), (), False), LayerRouted(1, (3,), (3,), False), TokenGenerated(1, 8, 0.55),
                LayerRouted(0, (1,), (), False), LayerRouted(1, (2,), (), False, (2,)), TokenGenerated(2, 9, 0.6)])
    view.show_model(model, None)
    assert view.values["tokens/s"] == "20.0 (3 tokens, the first after 0.50 s)"
    assert view.values["hit rate"] == "50.0% (2 hits, 1 late, 1 misses; with the prompt 28.6%)"


@pytest.mark.parametrize("theme", ["light", "dark"])
def test_a_memory_bars_free_part_and_outline_stand_out_from_the_window(qtbot, qapp, theme: str) -> None:
    # In the dark theme the outline had the window's colour: the RAM bar read as a stub of colour.
    apply_theme(qapp, theme)
    try:
        bar = StackedBar()
        qtbot.addWidget(bar)
        bar.resize(200, 18)
        bar.set_segments([Segment("this process", 10)], total=100)
        image = bar.grab().toImage()
        window = bar.palette().window().color()

        def apart(x: int, y: int) -> int:
            pixel = image.pixelColor(x, y)
            return max(abs(pixel.red() - window.red()), abs(pixel.green() - window.green()), abs(pixel.blue() - window.blue()))

        assert apart(150, 0) > 40 and apart(150, 9) > 8  # the outline, and the free part inside it
    finally:
        apply_theme(qapp, "light")


def test_a_value_wider_than_the_panel_is_cut_with_an_ellipsis_and_its_row_tooltip_holds_it_whole(
    qtbot, monkeypatch: pytest.MonkeyPatch
) -> None:
    # It used to be painted cut off at the panel's edge: "…; with the prompt 66.6" read as whole.
    view = CountersView()
    qtbot.addWidget(view)
    view.resize(320, view.sizeHint().height())
    whole = "79.2% (152 hits, 8 late, 32 misses; with the prompt 66.6%)"
    view.set_values({"hit rate": whole, "tokens/s": "32.4"})
    shown = view.shown_value("hit rate")
    assert shown.endswith("…") and whole.startswith(shown[:-1]) and view.shown_value("tokens/s") == "32.4"
    tooltips = []
    monkeypatch.setattr(QToolTip, "showText", lambda _at, text, *_: tooltips.append(text))
    row = view.names.index("hit rate")
    # The mouse resting on the row, as Qt tells the widget.
    QApplication.sendEvent(view, QHelpEvent(QEvent.Type.ToolTip, QPoint(5, row * view.line_height() + 2), QPoint()))
    assert tooltips == [f"hit rate: {whole}\n{view.tooltips['hit rate']}"]
    view.resize(2000, view.height())
    assert view.shown_value("hit rate") == whole


def test_a_new_generation_resets_the_counters_but_keeps_the_cache_map(recorded) -> None:
    events, info, _stats = recorded
    model = TelemetryModel(info.num_layers, info.experts_per_layer, info.bytes_per_copy)
    model.fold(events)
    cells = model.cells.copy()
    model.fold([LayerRouted(0, (1, 2), (), True)])
    assert model.generations == 2 and model.counters.tokens == 0 and model.recall == {}
    assert (model.cells == cells).all()


def test_a_reply_ended_in_its_prefill_does_not_run_into_the_next_ones_figures() -> None:
    model = TelemetryModel(num_layers=2, num_experts=4, bytes_per_copy=10)
    # One token, from the prefill alone (an end of text at once, or Stop): no decode layer runs.
    model.fold([LayerRouted(0, (0, 1), (0, 1), True), LayerRouted(1, (2,), (2,), True), TokenGenerated(0, 7, 0.1)])
    model.fold([LayerRouted(0, (3,), (3,), True), LayerRouted(1, (1,), (), True)])
    assert model.generations == 2 and (model.counters.hits, model.counters.misses) == (1, 1)


def test_another_model_of_the_same_shape_starts_the_panel_afresh(qtbot, window, backend) -> None:
    panel = window.panel
    for event in _snapshot_events():
        backend.engines[-1].events.emit(event)
    panel.refresh()
    assert panel.model.cell_counts()["not cached"] < 24
    other = replace(panel.info, name="other-moe", path="/models/other-moe")
    panel.set_model(other)
    assert panel.model.cell_counts()["not cached"] == 24 and panel.model.counters.misses == 0
    resized = replace(other, cache_slots=other.cache_slots + 1)
    model = panel.model
    panel.set_model(resized)
    assert panel.model is model, "the same model, resized, keeps its reply's figures"


def test_a_model_of_another_shape_never_sees_the_last_models_events(qtbot, window, backend) -> None:
    panel = window.panel
    events = [LayerRouted(1, (11,), (11,), False), CacheSnapshot(1, ((1, 11),), (SlotStatus.READY,))]
    for event in events:  # the last reply's events of the 2 x 12 model, not drained yet
        backend.engines[-1].events.emit(event)
    smaller = replace(panel.info, name="small-moe", path="/models/small-moe", num_layers=1, experts_per_layer=8,
                      cached=())
    panel.set_model(smaller)
    panel.refresh()  # raised IndexError folding layer 1, expert 11 into a 1 x 8 model
    assert panel.model.num_layers == 1 and panel.model.counters.misses == 0


def test_the_cache_map_shows_what_configure_filled_before_any_reply(qtbot, window) -> None:
    engine = Engine(load_model(str(demo_model_dir()), device="cpu"))
    engine.configure("seqmoe", cache_ratio=0.45)  # fills the cache with the predictor's likeliest experts
    info = model_info(engine)
    engine.close()
    assert len(info.cached) == info.cache_slots
    window.panel.set_model(info)
    cells = window.panel.model.cell_counts()
    assert cells["ready"] == info.cache_slots and cells["not cached"] == info.total_experts - info.cache_slots
    model = window.panel.model
    window.panel.set_model(replace(info, cache_slots=2, cached=((0, 5), (7, 1))))  # the same model, resized
    assert window.panel.model is model and model.cell_counts()["ready"] == 2 and model.cells[7, 1] == CELL_STATES.index("ready")


def test_a_resize_right_after_a_reply_is_not_painted_over_by_that_replys_last_snapshot(qtbot, window, backend) -> None:
    panel = window.panel
    for event in _snapshot_events():  # the reply's closing snapshot, not drained yet
        backend.engines[-1].events.emit(event)
    panel.set_model(replace(panel.info, cache_slots=1, cached=((1, 7),)))
    panel.refresh()
    cells = panel.model.cell_counts()
    assert cells["ready"] == 1 and cells["not cached"] == 23 and panel.model.counters.hits == 1


def test_a_load_refused_keeps_the_panel_on_the_model_kept_and_one_that_failed_later_leaves_none(qtbot, window) -> None:
    panel = window.panel
    shown = panel.info
    assert shown is not None
    window.load_model("broken")  # refused by its checks: the model loaded stays
    qtbot.waitUntil(lambda: not window.client.busy_loading, timeout=10_000)
    assert panel.info is not None and panel.info.path == shown.path and panel.model is not None
    window.load_model("too-big")  # fails once the model loaded went
    qtbot.waitUntil(lambda: panel.info is None and panel.model is None, timeout=10_000)


def test_recall_at_k_per_horizon_wraps_into_the_next_token() -> None:
    model = TelemetryModel(num_layers=3, num_experts=4, bytes_per_copy=10)
    model.fold([
        LayerRouted(0, (0, 1), (), True),  # prefill
        TokenGenerated(0, 7, 0.1),
        LayerRouted(1, (0, 1), (), False),
        # At layer 1: horizon 1 is layer 2, horizon 2 wraps to layer 0 of the next token.
        ExpertsForecast(1, (((2, 3), 0.9), ((2, 2), 0.8), ((2, 0), 0.1), ((0, 1), 0.7), ((0, 2), 0.6))),
        LayerRouted(2, (3, 0), (0,), False),  # top-2 forecast {3, 2}: one of two found
        TokenGenerated(1, 8, 0.2),
        LayerRouted(0, (1, 2), (), False),  # top-2 forecast {1, 2}: both found
    ])
    assert {h: (t.found, t.routed) for h, t in model.recall.items()} == {1: (1, 2), 2: (2, 2)}
    assert model.routed[2] == (3, 0) and model.routed[0] == (1, 2)
    assert model.predicted[2].tolist() == pytest.approx([0.1, 0.0, 0.8, 0.9])
    assert model.last_use[0, 2] == 2 and model.last_use[2, 3] == 1
    assert model.describe_cell(0, 2).splitlines()[1:] == ["last used at token 2", "predicted probability 0.60"]
    assert model.describe_cell(1, 3).splitlines()[1:] == ["not used yet", "no forecast yet"]


def test_layers_routed_without_a_forecast_are_grey_not_a_forecast_of_zero(qtbot) -> None:
    model = TelemetryModel(num_layers=3, num_experts=4, bytes_per_copy=10)
    model.fold([
        LayerRouted(0, (0, 1), (), True),
        TokenGenerated(0, 7, 0.1),
        LayerRouted(0, (0, 1), (), False),  # no forecast reached layers 0 and 1
        LayerRouted(1, (2, 3), (), False),
        ExpertsForecast(1, (((2, 3), 0.9),)),
        LayerRouted(2, (3, 0), (), False),
    ])
    view = ForecastView()
    qtbot.addWidget(view)
    view.resize(400, 300)
    view.show_model(model)
    grid = view.grid
    image = grid.grab().toImage()
    colour = lambda layer, expert: image.pixel(grid.cell_rect(layer, expert).center().toPoint())  # noqa: E731
    grey = QColor(NO_FORECAST_COLOUR).rgb()
    assert {colour(layer, expert) for layer in (0, 1) for expert in range(4)} == {grey}
    assert colour(2, 3) != grey and colour(2, 1) != grey and colour(2, 3) != colour(2, 1)
    assert grid.describe(0, 1).startswith("layer 0, expert 1: no forecast, routed")
    assert grid.describe(2, 3).startswith("layer 2, expert 3: forecast 0.90, routed")


def test_prefetch_accounting_used_cancelled_and_unused() -> None:
    model = TelemetryModel(num_layers=2, num_experts=4, bytes_per_copy=1000)
    model.fold([
        LayerRouted(0, (0,), (0,), True),
        TokenGenerated(0, 1, 0.5),
        PrefetchIssued((1, 1)), PrefetchIssued((1, 2)), PrefetchIssued((1, 3)), PrefetchCancelled((1, 3)),
        LayerRouted(1, (1,), (), False),
        ExpertEvicted((1, 2), unused=True),
        Stall((1, 1), 0.25, "late prefetch", False),
        TokenGenerated(1, 2, 1.0),
    ])
    counters = model.counters
    assert (counters.prefetch_used, counters.prefetch_copies, counters.prefetch_unused) == (1, 2, 1)
    assert counters.prefetch_precision == 0.5 and counters.copies == 3
    assert model.engine_bytes_per_s() == 3000.0
    assert model.stall_per_token == [0.0, 0.25]
    assert model.recent_stalls[0].cause == "late prefetch" and model.recent_stalls[0].token == 1


def _snapshot_events() -> list:
    """Five slots of the fake engine's 2 layers x 12 experts: one in use, two ready, one loading, one empty."""
    owners = ((0, 1), (0, 2), (1, 3), (1, 4), None)
    states = (SlotStatus.IN_USE, SlotStatus.READY, SlotStatus.LOADING, SlotStatus.READY, SlotStatus.EMPTY)
    return [LayerRouted(0, (1,), (), False), CacheSnapshot(0, owners, states)]


def _colour_counts(image: QImage, centres) -> dict[str, int]:
    by_colour = {QColor(colour).rgb(): CELL_STATES[state] for state, colour in STATE_COLOURS.items()}
    counts = dict.fromkeys(CELL_STATES, 0)
    for point in centres:
        counts[by_colour[image.pixel(point)]] += 1
    return counts


def test_the_cache_map_paints_the_states_of_the_stream(qtbot, window, backend) -> None:
    panel = window.panel
    assert panel.isVisible() and panel.sampling
    engine = backend.engines[-1]
    assert engine.events.active  # the panel's buffer follows the loaded engine
    for event in _snapshot_events():
        engine.events.emit(event)
    panel.refresh()
    expected = {"not cached": 20, "loading": 1, "ready": 2, "in use": 1}
    assert panel.model.cell_counts() == expected
    cache_map = panel.cache_map
    image = cache_map.grab().toImage()
    centres = [cache_map.cell_rect(layer, expert).center().toPoint() for layer in range(2) for expert in range(12)]
    assert _colour_counts(image, centres) == expected
    qtbot.mouseMove(cache_map, cache_map.cell_rect(0, 1).center().toPoint())
    qtbot.waitUntil(lambda: cache_map.toolTip().startswith("layer 0, expert 1: in use"), timeout=10_000)
    assert "last used at token 0" in cache_map.toolTip()


def test_a_smaller_model_coming_in_under_the_mouse_drops_the_hovered_cell(qtbot) -> None:
    # The cell of the model before was described with the new one's tables: an IndexError at every repaint.
    grid = LayerGrid()
    qtbot.addWidget(grid)
    grid.resize(400, 200)
    grid.show()
    qtbot.waitExposed(grid)
    shape = [48, 128]
    grid.describe = lambda layer, expert: f"layer {layer} of {shape[0]}, expert {expert} of {shape[1]}" if (
        layer < shape[0] and expert < shape[1]) else (_ for _ in ()).throw(IndexError(layer))
    grid.set_colours(np.zeros(tuple(shape), dtype=np.uint32))
    qtbot.mouseMove(grid, grid.cell_rect(47, 127).center().toPoint())
    qtbot.waitUntil(lambda: grid.toolTip() == "layer 47 of 48, expert 127 of 128", timeout=5000)
    shape[:] = [2, 12]
    grid.set_colours(np.zeros(tuple(shape), dtype=np.uint32))
    assert grid.toolTip() == ""
    qtbot.mouseMove(grid, grid.cell_rect(1, 11).center().toPoint())
    qtbot.waitUntil(lambda: grid.toolTip() == "layer 1 of 2, expert 11 of 12", timeout=5000)

def test_the_panel_samples_only_while_visible_and_remembers_it(qtbot, make_window, backend) -> None:
    window = make_window()
    panel, engine = window.panel, backend.engines[-1]
    window.panel.toggleViewAction().trigger()
    assert not panel.isVisible() and not panel.sampling and not engine.events.active
    engine.events.emit(_snapshot_events()[0])  # nobody listens: nothing is kept
    window.close()
    again = make_window()
    assert not again.panel.isVisible() and not backend.engines[-1].events.active
    again.panel.toggleViewAction().trigger()
    assert again.panel.sampling and backend.engines[-1].events.active


def test_without_nvml_the_panel_says_why_and_the_app_still_generates(qtbot, make_window, monkeypatch) -> None:
    monkeypatch.setitem(__import__("sys").modules, "pynvml", None)  # import pynvml raises ImportError
    window = make_window()
    sample = window.panel.monitor.sample()
    assert sample.gpu is None and sample.gpu_problem.startswith(f"{NO_NVML}: ")
    window.panel.refresh()
    assert window.panel.memory.problem.text().startswith(NO_NVML)
    assert "the engine's budget" in window.panel.memory.vram_caption.text()  # the engine's figures stay
    send(qtbot, window, "Still there?")
    wait_idle(qtbot, window)
    assert stored(window)[-1][2] == DONE


@pytest.mark.parametrize(("device", "caption"), [
    ("cpu", "Emulated VRAM on the cpu"), ("cuda:0", "The engine's VRAM on cuda:0 (no NVML figures)"),
])
def test_without_nvml_figures_the_caption_says_whose_vram_it_shows(qtbot, window, device: str, caption: str) -> None:
    memory = window.panel.memory
    memory.show_memory(replace(window.panel.info, device=device), MemorySample(None, NO_NVML, None, ""))
    assert memory.vram_caption.text().startswith(f"{caption}: the engine's budget")
    assert memory.vram_caption.text().endswith(" GiB")  # 2**30 bytes, named as the settings' slider names them


class _FailingNvml:
    """pynvml whose start works and whose readings raise, as on a driver that lacks a call."""

    class NVMLError(Exception):
        pass

    NVML_PCIE_UTIL_RX_BYTES = 1

    def nvmlInit(self) -> None:
        pass

    def nvmlDeviceGetHandleByIndex(self, index: int) -> object:
        return object()

    def nvmlDeviceGetMemoryInfo(self, handle: object) -> object:
        raise self.NVMLError("Not Supported")


class _WorkingNvml(_FailingNvml):
    def nvmlDeviceGetMemoryInfo(self, handle: object):
        return type("Memory", (), {"total": 24 * 2**30, "used": 10 * 2**30})()

    def nvmlDeviceGetName(self, handle: object) -> str:
        return "Test GPU"

    def nvmlDeviceGetComputeRunningProcesses(self, handle: object) -> list:
        import os

        process = type("Process", (), {})()
        process.pid, process.usedGpuMemory = os.getpid(), 3 * 2**30
        other = type("Process", (), {"pid": 1, "usedGpuMemory": 7 * 2**30})()
        return [process, other]

    def nvmlDeviceGetPcieThroughput(self, handle: object, counter: int) -> int:
        raise self.NVMLError("Not Supported")  # many GPUs cannot say; the engine's figure stands in


def test_a_failing_nvml_is_reported_and_never_raises(qtbot, make_window, monkeypatch) -> None:
    monkeypatch.setitem(__import__("sys").modules, "pynvml", _FailingNvml())
    window = make_window()
    sample = window.panel.monitor.sample()
    assert sample.gpu is None and sample.gpu_problem == f"{NO_NVML}: Not Supported"
    assert sample.ram is not None and sample.ram.total > 0
    send(qtbot, window, "Still there?")
    wait_idle(qtbot, window)
    assert stored(window)[-1][2] == DONE


def test_nvml_figures_split_the_vram(monkeypatch) -> None:
    monkeypatch.setitem(__import__("sys").modules, "pynvml", _WorkingNvml())
    gpu = MemoryMonitor().sample().gpu
    assert gpu is not None and gpu.name == "Test GPU" and gpu.this_process == 3 * 2**30
    assert gpu.available_to_this_process == 17 * 2**30 and gpu.pcie_rx_bytes_per_s is None


def test_the_monitor_samples_on_its_own_thread(monkeypatch) -> None:
    monkeypatch.setattr(memory_monitor, "SAMPLE_INTERVAL_S", 0.01)
    monitor = MemoryMonitor(interval_s=0.01)
    monitor.start()
    try:
        import time

        deadline = time.monotonic() + 5
        while monitor.latest is None and time.monotonic() < deadline:
            time.sleep(0.01)
    finally:
        monitor.stop()
    assert monitor.latest is not None and not monitor.running


def test_export_writes_the_figures_as_json_and_the_charts_as_png(qtbot, window, backend, tmp_path: Path) -> None:
    engine = backend.engines[-1]
    for event in [LayerRouted(0, (1, 2), (), True), TokenGenerated(0, 5, 0.2), *_snapshot_events()]:
        engine.events.emit(event)
    written = window.panel.export_to(tmp_path / "figures")
    data = json.loads(written[0].read_text())
    assert data["format"] == "seqmoe-panel-figures" and data["model"]["name"] == "seqmoe-demo"
    assert data["figures"]["counters"]["tokens"] == 1 and data["figures"]["cache_cells"]["in use"] == 1
    pngs = {path.name.rsplit("-", 1)[-1] for path in written[1:]}
    assert {"map.png", "forecast.png", "stalls.png", "memory.png", "panel.png"} <= pngs
    for path in written[1:]:
        image = QImage(str(path))
        assert not image.isNull() and image.width() > 10


def test_the_panel_costs_little_while_the_demo_model_generates(qtbot, data_dir: Path) -> None:
    """Robust figures only; tools/measure_panel.py compares visible and hidden properly."""
    import time

    from seqmoe_chat.application import open_context
    from seqmoe_chat.main_window import MainWindow

    context = open_context(data_dir)
    context.settings.engine.policy = "seqmoe"
    window = MainWindow(context)
    qtbot.addWidget(window)
    window.show()
    window.start()
    qtbot.waitUntil(lambda: model_shown(window), timeout=120_000)
    started = time.perf_counter()
    send(qtbot, window, "Hello! What do you like to do on weekends?")
    qtbot.waitUntil(lambda: not window.session.busy, timeout=120_000)
    wall = time.perf_counter() - started
    window.panel.refresh()
    cost = window.panel.cost
    print(f"\npanel while generating: {cost.refreshes} refreshes, {cost.events} events, "
          f"{cost.share_of_core(wall):.1%} of a core in refreshes over {wall:.1f} s")
    assert cost.refreshes > 0 and cost.events > 0 and window.panel.model.counters.tokens > 0
    window.close()


def test_the_model_and_the_monitor_import_neither_qt_nor_the_engine() -> None:
    import subprocess
    import sys

    code = (
        "import sys\n"
        "class Block:\n"
        "    def find_spec(self, name, path=None, target=None):\n"
        "        if name.split('.')[0] in ('PySide6', 'seqmoe', 'torch'):\n"
        "            raise ImportError(f'{name} is blocked')\n"
        "sys.meta_path.insert(0, Block())\n"
        "import seqmoe_chat.panel.telemetry_model, seqmoe_chat.panel.memory_monitor\n"
    )
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert result.returncode == 0, result.stderr

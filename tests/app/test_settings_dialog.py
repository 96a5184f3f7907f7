"""The settings dialog: the VRAM-budget slider and what it shows, the engine page, and the
budget applied to the real demo model between two generations without reloading it."""

from __future__ import annotations

import sqlite3
import sys
from dataclasses import replace
from types import ModuleType

import pytest
from PySide6.QtCore import QEventLoop, QObject, QTimer, Slot
from seqmoe.budget import FREE_MEMORY_MARGIN, CacheGeometry
from seqmoe.hardware import DEFAULT_SETUP
from seqmoe.resources import demo_model_dir

from seqmoe_chat import engine_import
from seqmoe_chat.budget_slider import GIB, BudgetSlider, describe_budget
from seqmoe_chat.engine_client import EngineClient
from seqmoe_chat.engine_settings import EngineContext, context_text, engine_context, horizon_text, link_text
from seqmoe_chat.panel.memory_monitor import GpuMemory, MemorySample
from seqmoe_chat.settings_dialog import SettingsDialog
from seqmoe_chat.store import ConversationStore, EngineOptions, SamplingSettings, Settings, open_database
from seqmoe_chat.store.records import ASSISTANT, DONE
from seqmoe_chat.store.settings import MAX_VRAM_BUDGET_GB
from seqmoe_chat.store.speed_history import expected_speed, measured_speeds
from seqmoe_chat.worker import ModelInfo

from .test_chat import send, wait_idle

GEOMETRY = CacheGeometry(total_experts=64, bytes_per_expert=50 * 2**20, resident_bytes=2 * GIB, kv_bytes=GIB // 2,
                         workspace_bytes=GIB // 2, top_k=2)
MODEL = ModelInfo("test-moe", "/models/test-moe", "cuda:0", "TestMoe", "seqmoe", 20, 64, GEOMETRY, 4, 16,
                  "cuda", 25.0, 4, max_horizon=4, context_tokens=8192, context_limit=32768)


def test_the_slider_shows_slots_ratio_speed_and_fit_live(qtbot) -> None:
    slider = BudgetSlider(MODEL, available_bytes=8 * GIB, speeds={20: 12.0, 40: 20.0}, budget_gb=None,
                          cache_ratio=0.45)
    qtbot.addWidget(slider)
    slider.enabled_box.setChecked(True)
    # Initially at the budget that buys the current 20 slots.
    assert slider.slots.text() == "20 of 64 (cache ratio 0.31)" and "12.0 tok/s (measured at 20 slots)" in slider.speed.text()
    slider.spin.setValue(GEOMETRY.budget_bytes_for(30) / GIB + 0.001)
    assert slider.slots.text().startswith("30 of 64") and "16.0 tok/s (between the 20 and 40 slots measured)" in slider.speed.text()
    assert slider.slider.value() == round(slider.spin.value() * GIB / slider.unit)
    assert slider.fit.text().startswith("Runs with SeqMoE: 47%")
    slider.slider.setValue(slider.slider.minimum())
    assert slider.fit.text().startswith("Too small") and slider.speed.text() == "–"
    # 8 GiB are free and the whole model takes 6.1 GiB: the slider ends where everything fits.
    slider.slider.setValue(slider.slider.maximum())
    assert slider.spin.value() == pytest.approx(GEOMETRY.budget_bytes_for(64) / GIB, abs=0.001)
    assert slider.fit.text().startswith("Fits entirely")
    assert slider.budget_gb() == round(slider.spin.value(), 3)
    slider.enabled_box.setChecked(False)
    assert slider.budget_gb() is None and slider.slots.text().startswith("29 of 64")


def test_unchecked_on_a_gpu_the_cache_is_sized_to_the_free_vram(qtbot) -> None:
    automatic = GEOMETRY.budget_bytes_for(40) + GIB // 100
    slider = BudgetSlider(MODEL, available_bytes=8 * GIB, speeds={}, budget_gb=None, cache_ratio=0.45,
                          automatic_bytes=automatic)
    qtbot.addWidget(slider)
    assert slider.budget_gb() is None
    assert slider.slots.text() == "40 of 64 (cache ratio 0.62), sized to the free VRAM"
    assert "free VRAM" in slider.enabled_box.toolTip()


def test_the_engine_page_knows_the_automatic_budget_on_a_gpu_only() -> None:
    gpu = GpuMemory("Test GPU", total=24 * GIB, used=10 * GIB, this_process=4 * GIB, pcie_rx_bytes_per_s=None)
    sample = MemorySample(gpu, "", None, "")
    on_gpu = engine_context(MODEL, sample, sqlite3.connect(":memory:"))
    assert on_gpu.available_bytes == 18 * GIB
    assert on_gpu.automatic_bytes == 4 * GIB + int((1 - FREE_MEMORY_MARGIN) * 14 * GIB)
    on_cpu = engine_context(replace(MODEL, device="cpu"), sample, sqlite3.connect(":memory:"))
    assert on_cpu.available_bytes is None and on_cpu.automatic_bytes is None


def test_the_slider_stops_at_the_available_vram_and_says_not_measured_yet(qtbot) -> None:
    slider = BudgetSlider(MODEL, available_bytes=4 * GIB, speeds={}, budget_gb=3.5, cache_ratio=0.45)
    qtbot.addWidget(slider)
    assert slider.spin.maximum() == pytest.approx(4.0) and slider.speed.text() == "not measured yet"
    assert slider.spin.singleStep() == pytest.approx(0.05)
    slider.slider.setValue(slider.slider.maximum())
    assert slider.fit.text().startswith("Runs with SeqMoE")  # 4 GiB never holds all 64 experts


def test_without_a_model_the_budget_can_still_be_set() -> None:
    assert describe_budget(None, 4 * GIB, {})[0] == "load a model to see what a budget buys"
    assert horizon_text(None) == "shown once a model is loaded"
    assert horizon_text(replace(MODEL, policy="lru", predictor_horizon=None)) == "none: the lru policy does not forecast"
    assert horizon_text(MODEL) == "now 4 MoE layers ahead with the seqmoe policy; this model's predictor reaches 4"
    assert "calibrate" in horizon_text(replace(MODEL, predictor_horizon=1, max_horizon=1))


def test_the_context_note_says_when_the_model_limits_the_context() -> None:
    capped = replace(MODEL, context_tokens=1024, context_limit=1024)
    assert context_text(capped) == "test-moe now holds 1,024 tokens: the model's own limit; the VRAM budget includes their KV cache"
    assert context_text(None) == "shown once a model is loaded"


@pytest.mark.parametrize("model", [None, replace(MODEL, predictor_horizon=1, max_horizon=1)])
def test_a_horizon_the_dialog_cannot_show_is_kept(qtbot, model) -> None:
    # No model loaded, or one whose predictor reaches a single layer: the box shows 1.
    settings = Settings(engine=EngineOptions(policy="seqmoe", horizon=2))
    dialog = SettingsDialog(settings, engine=EngineContext(model, 8 * GIB, lambda policy: {}))
    qtbot.addWidget(dialog)
    dialog.apply_to(settings)
    assert settings.engine.horizon == 2


def test_a_budget_beyond_what_this_models_box_shows_is_kept_unless_changed(qtbot) -> None:
    # Chosen with a larger model loaded; lowered to this model's top, going back to the larger
    # one would have found its budget too small.
    settings = Settings(engine=EngineOptions(vram_budget_gb=8.0))
    dialog = SettingsDialog(settings, engine=EngineContext(MODEL, 8 * GIB, lambda policy: {}))
    qtbot.addWidget(dialog)
    assert dialog.engine.budget.spin.value() < 8.0
    dialog.apply_to(settings)
    assert settings.engine.vram_budget_gb == 8.0
    dialog.engine.budget.slider.setValue(dialog.engine.budget.slider.minimum() + 5)
    dialog.apply_to(settings)
    assert settings.engine.vram_budget_gb == round(dialog.engine.budget.spin.value(), dialog.engine.budget.spin.decimals())


def test_a_cuda_gpu_that_pytorch_here_cannot_use_cannot_be_saved(qtbot) -> None:
    dialog = SettingsDialog(Settings(), engine=EngineContext(MODEL, 8 * GIB, lambda policy: {}, cuda=False))
    qtbot.addWidget(dialog)
    dialog.engine.device.setCurrentIndex(dialog.engine.device.findData("cuda"))
    assert not dialog.ok_button.isEnabled() and "cannot use a CUDA GPU" in dialog.refusal.text()
    dialog.engine.device.setCurrentIndex(dialog.engine.device.findData("auto"))
    assert dialog.ok_button.isEnabled()
    unknown = SettingsDialog(Settings(), engine=EngineContext(cuda=None))  # PyTorch not loaded yet: not known
    qtbot.addWidget(unknown)
    unknown.engine.device.setCurrentIndex(unknown.engine.device.findData("cuda"))
    assert unknown.ok_button.isEnabled()


def test_settings_opened_while_the_engine_is_first_imported_leave_the_half_imported_pytorch_alone(monkeypatch) -> None:
    # The engine's thread imports PyTorch as the first model loads: until then sys.modules holds a
    # torch without torch.cuda, and Settings opened in the first seconds did nothing but raise.
    monkeypatch.setattr(engine_import, "_imported", False, raising=False)
    monkeypatch.setitem(sys.modules, "torch", ModuleType("torch"))
    no_gpu = MemorySample(None, "no GPU", None, "")
    assert engine_context(None, no_gpu, sqlite3.connect(":memory:")).cuda is None
    monkeypatch.undo()
    engine_import.import_engine()  # whole now, in this process already
    assert engine_import.engine_imported() and isinstance(engine_context(None, no_gpu, sqlite3.connect(":memory:")).cuda, bool)


def test_the_link_note_says_what_the_emulated_link_runs_at() -> None:
    emulated = replace(MODEL, device="cpu", link="emulated", link_gbps=0.0567, link_setup=DEFAULT_SETUP)
    assert link_text(emulated) == "now 0.0567 GB/s: one expert copy takes 3.9 layers of test-moe's decode, timed here"
    assert link_text(replace(emulated, link_setup=None)) == "test-moe copies at the fixed speed"
    assert link_text(MODEL) == "unused: test-moe copies over cuda"
    assert link_text(None) == "shown once a model is loaded"


def test_measured_speeds_count_only_replies_on_the_same_link(tmp_path) -> None:
    store = ConversationStore(open_database(tmp_path / "chats.sqlite3").connection)
    conversation = store.create()
    base = {"policy": "seqmoe", "device": "cpu", "link": "emulated", "bytes_per_copy": 82972.5}
    replies = [  # oldest first
        ({**base, "cache_slots": 10, "decode_tokens_per_s": 50.0}, "demo"),  # stored before the link was recorded
        ({**base, "cache_slots": 30, "decode_tokens_per_s": 9.0, "link_setup": DEFAULT_SETUP, "bytes_per_copy": 110592.0},
         "demo"),  # copies of more bytes: before the experts were packed
        ({**base, "cache_slots": 10, "decode_tokens_per_s": 60.0, "link_setup": None, "link_gbps": 25.0}, "demo"),
        ({**base, "cache_slots": 10, "decode_tokens_per_s": 20.0, "link_setup": DEFAULT_SETUP, "link_gbps": 0.013}, "demo"),
        ({**base, "cache_slots": 20, "decode_tokens_per_s": 30.0, "link_setup": DEFAULT_SETUP, "link_gbps": 0.017}, "demo"),
        ({**base, "cache_slots": 20, "decode_tokens_per_s": 99.0, "link_setup": DEFAULT_SETUP}, "other-model"),
    ]
    for stats, model_id in replies:
        message = store.add_message(conversation.id, None, ASSISTANT, "", DONE)
        store.update_message(message.id, stats=stats, model_id=model_id)
    chats = store.connection
    # Matched to the same setup: its speed follows the machine's, so any of them counts.
    assert measured_speeds(chats, "demo", "seqmoe", "cpu", DEFAULT_SETUP, 0.015, 82972.5) == {10: 20.0, 20: 30.0}
    assert measured_speeds(chats, "demo", "seqmoe", "cpu", None, 25.0) == {10: 60.0}
    assert measured_speeds(chats, "demo", "seqmoe", "cpu", None, 2.5) == {}
    assert measured_speeds(chats, "demo", "gate", "cpu", DEFAULT_SETUP, 0.015) == {}


def test_expected_speed_from_measurements() -> None:
    assert expected_speed({}, 10) is None
    assert expected_speed({10: 5.0}, 30).tokens_per_s == 5.0
    assert expected_speed({10: 5.0, 30: 9.0}, 20).tokens_per_s == pytest.approx(7.0)


def test_the_dialog_applies_every_setting(qtbot) -> None:
    settings = Settings(sampling=SamplingSettings(temperature=0.0))
    dialog = SettingsDialog(settings, engine=EngineContext(MODEL, 8 * GIB, lambda policy: {}))
    qtbot.addWidget(dialog)
    page = dialog.engine
    page.policy.setCurrentIndex(page.policy.findData("gate"))
    page.device.setCurrentIndex(page.device.findData("cpu"))
    assert page.link_setup.currentData() == DEFAULT_SETUP and not page.link.isEnabled()
    page.link_setup.setCurrentIndex(page.link_setup.count() - 1)
    assert page.link_setup.currentText() == "a fixed speed" and page.link.isEnabled()
    page.link.setValue(3.5)
    assert page.horizon.maximum() == 4 and page.horizon.value() == 4
    page.horizon.setValue(2)
    page.budget.enabled_box.setChecked(True)
    page.budget.spin.setValue(3.25)
    assert page.context.value() == 4096 and page.context_note.text().startswith("test-moe now holds 8,192 tokens;")
    page.context.setValue(16384)
    dialog.panel_hz.setValue(4)
    dialog.theme.setCurrentIndex(dialog.theme.findData("dark"))
    dialog.apply_to(settings)
    assert settings.engine == EngineOptions(device="cpu", policy="gate", cache_ratio=0.45, vram_budget_gb=3.25,
                                            link_setup=None, link_gbps=3.5, horizon=2, context_tokens=16384)
    assert not page.horizon.isEnabled(), "only the seqmoe policy looks several layers ahead"
    page.policy.setCurrentIndex(page.policy.findData("seqmoe"))
    assert page.horizon.isEnabled()
    page.horizon.setValue(4)
    dialog.apply_to(settings)
    assert settings.engine.horizon is None, "the predictor's whole reach is stored as no limit"
    assert (settings.panel_hz, settings.theme) == (4, "dark")
    page.policy.setCurrentIndex(page.policy.findData("full"))
    assert not page.budget.isEnabled()
    page.link_setup.setCurrentIndex(page.link_setup.findData("rtx4060laptop-pcie4x8-olmoe"))
    assert page.link_setup.currentText().startswith("as RTX 4060 Laptop, PCIe 4.0 x8")
    dialog.apply_to(settings)
    assert (settings.engine.link_setup, settings.engine.link_gbps) == ("rtx4060laptop-pcie4x8-olmoe", 3.5)


def test_a_budget_below_the_models_minimum_cannot_be_saved(qtbot) -> None:
    # Saved, it would make the model fail to load at every start until the box was unticked.
    dialog = SettingsDialog(Settings(), engine=EngineContext(MODEL, 8 * GIB, lambda policy: {}))
    qtbot.addWidget(dialog)
    budget = dialog.engine.budget
    budget.enabled_box.setChecked(True)
    assert dialog.ok_button.isEnabled()
    budget.spin.setValue(GEOMETRY.budget_bytes_for(GEOMETRY.minimum_slots) / GIB - 0.002)
    assert not dialog.ok_button.isEnabled()
    assert not dialog.refusal.isHidden() and "below the minimum test-moe needs" in dialog.refusal.text()
    budget.spin.setValue(GEOMETRY.budget_bytes_for(GEOMETRY.minimum_slots) / GIB + 0.001)
    assert dialog.ok_button.isEnabled() and dialog.refusal.isHidden()
    budget.slider.setValue(budget.slider.minimum())
    assert not dialog.ok_button.isEnabled()
    budget.enabled_box.setChecked(False)  # the cache sized by its ratio: nothing to refuse
    assert dialog.ok_button.isEnabled()
    budget.enabled_box.setChecked(True)
    dialog.engine.policy.setCurrentIndex(dialog.engine.policy.findData("full"))  # takes no budget
    assert dialog.ok_button.isEnabled()
    # Without a model the minimum is unknown: any budget is kept, the load says if it is too small.
    unknown = SettingsDialog(Settings(), engine=EngineContext(None, None, lambda policy: {}))
    qtbot.addWidget(unknown)
    unknown.engine.budget.enabled_box.setChecked(True)
    unknown.engine.budget.spin.setValue(0.001)
    assert unknown.ok_button.isEnabled()


def test_accepted_settings_reconfigure_the_loaded_model_and_are_saved(qtbot, window, backend, monkeypatch) -> None:
    def accept(dialog: SettingsDialog) -> int:
        dialog.engine.budget.enabled_box.setChecked(True)
        dialog.engine.budget.spin.setValue(GEOMETRY_OF_FAKE.budget_bytes_for(6) / GIB + 0.0005)
        return 1

    GEOMETRY_OF_FAKE = backend.engines[-1].geometry
    monkeypatch.setattr(SettingsDialog, "exec", accept)
    window.open_settings()
    dialog = window.findChild(SettingsDialog)
    folders = [dialog.tabs.tabText(i) for i in range(dialog.tabs.count())]
    assert folders == ["Chat", "Engine", "Live panel", "Appearance", "Folders"]
    qtbot.waitUntil(lambda: window.client.model.cache_slots == 6, timeout=5000)
    assert backend.engines[-1].cache_slots == 6 and len(backend.engines) == 1  # resized, not reloaded
    assert window.panel.info.cache_slots == 6
    stored = window.context.settings_store.load()
    assert stored.engine.vram_budget_gb == window.settings.engine.vram_budget_gb is not None
    send(qtbot, window, "After the resize")
    wait_idle(qtbot, window)


def test_a_new_context_waits_for_the_next_load_and_says_so(qtbot, window, backend, monkeypatch) -> None:
    def accept(dialog: SettingsDialog) -> int:
        dialog.engine.context.setValue(8192)
        return 1

    monkeypatch.setattr(SettingsDialog, "exec", accept)
    window.open_settings()
    assert window.status.currentMessage() == "The context applies when the model is next loaded."
    qtbot.wait(300)  # no reconfigure sent for it, whose answer painted over the notice
    assert window.status.currentMessage() == "The context applies when the model is next loaded."
    assert window.context.settings_store.load().engine.context_tokens == 8192
    assert len(backend.engines) == 1 and backend.engines[-1].context_tokens == 4096


@pytest.fixture(scope="module")
def demo_client(qapp):
    """The real worker with the real demo model on the CPU, seqmoe policy, 30% of the experts."""
    client = EngineClient()
    loop = QEventLoop()
    client.worker.sig_model_loaded.connect(loop.quit)
    client.worker.sig_load_failed.connect(loop.quit)
    QTimer.singleShot(120_000, loop.quit)
    client.load(str(demo_model_dir()), EngineOptions(device="cpu", policy="seqmoe", cache_ratio=0.3))
    loop.exec()
    assert client.model is not None, "the demo model did not load"
    yield client
    client.shut_down()


class Collector(QObject):
    """Receives the worker's signals on this (the GUI) thread, in the order they were sent."""

    def __init__(self, client: EngineClient) -> None:
        super().__init__()
        self.events: list[tuple] = []
        worker = client.worker
        worker.sig_reply_finished.connect(self.on_reply_finished)
        worker.sig_model_reconfigured.connect(self.on_reconfigured)
        worker.sig_reconfigure_failed.connect(self.on_reconfigure_failed)

    @Slot(int, object)
    def on_reply_finished(self, request_id: int, result: object) -> None:
        self.events.append(("reply", request_id, result))

    @Slot(int, object)
    def on_reconfigured(self, request_id: int, info: object) -> None:
        self.events.append(("resized", request_id, info))

    @Slot(int, str, object)
    def on_reconfigure_failed(self, request_id: int, reason: str, info: object) -> None:
        self.events.append(("refused", request_id, reason, info))

    def wait_for(self, qtbot, request_id: int) -> tuple:
        qtbot.waitUntil(lambda: any(event[1] == request_id for event in self.events), timeout=120_000)
        return next(event for event in self.events if event[1] == request_id)


def test_the_budget_resizes_the_demo_models_cache_between_generations(qtbot, demo_client) -> None:
    collector = Collector(demo_client)
    messages = [{"role": "user", "content": "Tell me about the mountains you like to hike."}]
    greedy = SamplingSettings(temperature=0.0, max_new_tokens=12)
    before = demo_client.model
    first = collector.wait_for(qtbot, demo_client.generate(messages, greedy))[2]
    assert first.stats["cache_slots"] == before.cache_slots
    geometry = before.geometry
    budget = (geometry.budget_bytes_for(before.cache_slots * 2) + geometry.bytes_per_expert // 2) / GIB  # mid-slot
    options = EngineOptions(device="cpu", policy="seqmoe", vram_budget_gb=budget)
    # Asked for while a reply runs: the resize waits for it.
    running = demo_client.generate(messages, greedy)
    resize = demo_client.reconfigure(options)
    _, _, after = collector.wait_for(qtbot, resize)
    assert [event[1] for event in collector.events[1:]] == [running, resize]
    assert collector.events[1][2].stats["cache_slots"] == before.cache_slots
    assert after.cache_slots == before.geometry.slots_for_budget(int(options.vram_budget_gb * GIB))
    assert after.cache_slots == 2 * before.cache_slots == demo_client.model.cache_slots
    second = collector.wait_for(qtbot, demo_client.generate(messages, greedy))[2]
    assert second.stats["cache_slots"] == after.cache_slots
    assert second.text == first.text  # the same greedy reply from a larger cache
    print(f"\ndemo model: {before.cache_slots} slots {first.stats['decode_tokens_per_s']:.1f} tok/s, "
          f"{after.cache_slots} slots {second.stats['decode_tokens_per_s']:.1f} tok/s")


def test_a_shorter_horizon_applies_between_generations_with_the_same_reply(qtbot, demo_client) -> None:
    collector = Collector(demo_client)
    messages = [{"role": "user", "content": "What do you like to cook?"}]
    greedy = SamplingSettings(temperature=0.0, max_new_tokens=10)
    first = collector.wait_for(qtbot, demo_client.generate(messages, greedy))[2]
    options = EngineOptions(device="cpu", policy="seqmoe", cache_ratio=0.3, horizon=1)
    after = collector.wait_for(qtbot, demo_client.reconfigure(options))[2]
    assert (after.policy, after.predictor_horizon, after.max_horizon) == ("seqmoe", 1, 8)
    assert collector.wait_for(qtbot, demo_client.generate(messages, greedy))[2].text == first.text


def test_a_budget_below_the_minimum_is_refused_and_the_cache_kept(qtbot, demo_client) -> None:
    collector = Collector(demo_client)
    slots = demo_client.model.cache_slots
    request = demo_client.reconfigure(EngineOptions(device="cpu", policy="seqmoe", vram_budget_gb=0.01))
    _kind, _id, reason, info = collector.wait_for(qtbot, request)
    assert "minimum" in reason and info.cache_slots == slots == demo_client.model.cache_slots


def test_with_experts_smaller_than_the_spin_boxs_steps_every_slider_step_buys_one_more_slot(qtbot) -> None:
    # The demo model's shape: 128 experts of 108 KiB, about 0.0001 GiB each.
    tiny = CacheGeometry(total_experts=128, bytes_per_expert=110_592, resident_bytes=3_276_800, kv_bytes=3_145_728,
                         workspace_bytes=16 * 2**20, top_k=2)
    model = replace(MODEL, geometry=tiny, total_experts=128, cache_slots=58)
    slider = BudgetSlider(model, available_bytes=None, speeds={}, budget_gb=None, cache_ratio=0.45)
    qtbot.addWidget(slider)
    slider.enabled_box.setChecked(True)
    assert slider.slots.text().startswith("58 of 128")
    bought = []
    for step in range(slider.slider.minimum(), slider.slider.maximum() + 1):
        slider.slider.setValue(step)
        saved = slider.budget_gb()
        # What is saved is what the engine sizes its cache by: int(GiB * 2**30) bytes.
        bought.append(tiny.slots_for_budget(int(saved * GIB)) if step >= tiny.minimum_slots else None)
        assert slider.slider.value() == step and (step < tiny.minimum_slots or slider.slots.text().startswith(f"{step} of"))
    assert bought[tiny.minimum_slots:] == list(range(tiny.minimum_slots, 129))
    # The spin box's arrows move one slot too, in both directions.
    slider.slider.setValue(40)
    slider.spin.stepBy(1)
    assert slider.slots.text().startswith("41 of") and slider.slider.value() == 41
    slider.spin.stepBy(-3)
    assert slider.slots.text().startswith("38 of") and tiny.slots_for_budget(int(slider.budget_gb() * GIB)) == 38


# OLMoE's shape: 12 MiB experts, so the slider steps by a MB and its top, every expert, is no whole step.
OLMOE = CacheGeometry(total_experts=1024, bytes_per_expert=12 * 2**20, resident_bytes=2 * 10**9, kv_bytes=2**22,
                      workspace_bytes=2**26, top_k=8)


def test_the_sliders_right_end_holds_every_expert(qtbot) -> None:
    slider = BudgetSlider(replace(MODEL, geometry=OLMOE, total_experts=1024, cache_slots=512), available_bytes=None,
                          speeds={}, budget_gb=None, cache_ratio=0.45)
    qtbot.addWidget(slider)
    slider.enabled_box.setChecked(True)
    slider.slider.setValue(slider.slider.maximum())
    assert slider.slots.text() == "1024 of 1024 (cache ratio 1.00)" and slider.fit.text().startswith("Fits entirely")
    assert OLMOE.slots_for_budget(int(slider.budget_gb() * GIB)) == 1024
    slider.slider.setValue(slider.slider.maximum() - 1)
    assert slider.slots.text().startswith("1023 of 1024")
    slider.spin.setValue(slider.spin.maximum())  # the box's top is the slider's right end
    assert slider.slider.value() == slider.slider.maximum()


@pytest.mark.parametrize("geometry", [
    replace(OLMOE, bytes_per_expert=0),  # no expert bytes: no count of them to buy
    replace(OLMOE, total_experts=10**6, bytes_per_expert=4 * GIB),  # 4 PiB of experts
    replace(OLMOE, total_experts=2**40, bytes_per_expert=1),  # more experts than a slider has steps
    replace(OLMOE, resident_bytes=2**52),  # more than any budget the settings keep
])
def test_the_slider_opens_for_any_model_and_offers_only_budgets_the_settings_keep(qtbot, geometry) -> None:
    slider = BudgetSlider(replace(MODEL, geometry=geometry, total_experts=geometry.total_experts, cache_slots=3),
                          available_bytes=None, speeds={}, budget_gb=None, cache_ratio=0.45)
    qtbot.addWidget(slider)
    slider.enabled_box.setChecked(True)
    for step in (slider.slider.minimum(), slider.slider.maximum()):
        slider.slider.setValue(step)
        assert 0 < slider.budget_gb() <= MAX_VRAM_BUDGET_GB + 0.001 and slider.slots.text()


def test_a_tiny_models_least_budget_shows_its_significant_digits() -> None:
    # A test model's least budget is millionths of a GiB: four decimals showed it as 0.0000.
    tiny = CacheGeometry(total_experts=16, bytes_per_expert=100, resident_bytes=10_000, kv_bytes=100, workspace_bytes=100,
                         top_k=2)
    model = replace(MODEL, geometry=tiny, total_experts=16)
    assert describe_budget(model, 0, {})[2] == "Too small: test-moe needs at least 0.00000978 GiB."
    assert tiny.slots_for_budget(int(0.00000978 * GIB)) == tiny.minimum_slots
    assert describe_budget(MODEL, 0, {})[2] == "Too small: test-moe needs at least 3.147 GiB."

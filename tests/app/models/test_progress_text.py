"""What a download row says: bytes, speed and time left from a sliding window, and the
reason when it is not downloading."""

from __future__ import annotations

from seqmoe_chat.model_manager.downloads_tab import detail_text
from seqmoe_chat.models.download_queue import DONE, FAILED, QUEUED, RUNNING, DownloadEntry
from seqmoe_chat.models.transfer_rate import TransferRate


def test_speed_and_time_left_follow_the_recent_bytes() -> None:
    rate = TransferRate(window_s=8.0)
    for second in range(20):
        rate.add(float(second), second * 10_000_000)  # 10 MB/s
    assert rate.bytes_per_s() == 10_000_000
    assert rate.seconds_left(600_000_000) == 60.0
    for second in range(20, 30):
        rate.add(float(second), 190_000_000)  # stalled: the speed falls within the window
    assert rate.bytes_per_s() == 0.0 and rate.seconds_left(1) is None


def test_a_restart_from_zero_is_not_a_negative_speed() -> None:
    rate = TransferRate()
    rate.add(0.0, 5_000_000)
    rate.add(1.0, 1_000_000)
    assert rate.bytes_per_s() == 0.0


def test_row_texts() -> None:
    running = DownloadEntry("a/b", state=RUNNING, total_bytes=13_800_000_000, done_bytes=1_200_000_000, message="Downloading")
    assert detail_text(running, 25_300_000, 498.0) == "1.2 GB of 13.8 GB · 25.3 MB/s · 8 min left"
    queued = DownloadEntry("a/b", state=QUEUED, total_bytes=2_000_000, done_bytes=500_000)
    assert detail_text(queued, 0.0, None) == "Queued: 500.0 kB of 2.0 MB already here"
    failed = DownloadEntry("a/b", state=FAILED, message="the disk filled up while downloading x")
    assert detail_text(failed, 0.0, None) == failed.message
    done = DownloadEntry("a/b", state=DONE, message="Downloaded and verified", path="/m/a--b")
    assert detail_text(done, 0.0, None) == "Downloaded and verified: /m/a--b"

"""Loaded as a plug-in by ``bench/latency.py`` for its "before" runs only: channels linger as before
issue 34 (a fixed linger of the latency target after the oldest buffered tuple, whatever the rate,
or a full batch; watermarks and a window's fire wait with the data; a batch of any size goes as
one frame), to compare in one run."""

from pescheduler.worker import channels
from pescheduler.worker.channels import DATA, WATERMARK, ChannelOut


def _ripe(self) -> bool:
    return (not self.latency_s or self._urgent or self._tuples >= self.batch_size or self._since is None
            or channels.perf_counter() >= self._since + self.latency_s)


def _watermark(self, wm: int) -> None:
    if self.pending and self.pending[-1][0] == WATERMARK:
        self.pending[-1] = (WATERMARK, wm)
    else:
        self.pending.append((WATERMARK, wm))


def _send(self, batch) -> None:
    self.pending.append((DATA, batch))
    if self.latency_s:
        if not self._tuples:
            self._since = channels.perf_counter()
        self._tuples += len(batch)


ChannelOut.ripe = _ripe
ChannelOut.send = _send
ChannelOut.target = property(lambda self: self.batch_size, lambda self, value: None)
ChannelOut.urge = lambda self: None
ChannelOut.watermark = _watermark


@__import__("pescheduler").hookimpl
def pescheduler_operators():
    return []

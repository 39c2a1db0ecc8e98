"""The running batch of decoding: sequences that decode together, in a cache of slots allocated ahead.

A ``DynamicCache`` concatenates every decoding step's keys and values onto the whole cache (a copy of all of it, every
layer, every step), and dropping a finished row selects the remaining rows (another copy of all of it). On long
answers these copies cost more than the model's matmuls (``benchmarks/decode_step.py``, Qwen2.5-Coder-1.5B in
bfloat16, 128 rows, 2 cores: at 1000 cached tokens a step took 3.47 s and a row leaving 2.08 s, in these slots 1.73 s
and 0.011 s; at 100 tokens 1.34 s, the slots 1.41 s). Here each layer keeps its keys and values in buffers of
(capacity rows, kv heads, columns, head dim) (``SlotLayer``):

- a step writes its one column into the buffers, at column ``end`` for every row (rows are left-padded);
- attention reads the buffers of the live rows whole (``[:rows]``, contiguous: a view of a window of columns would
  make every attention matmul copy it first, 3-4x slower), the columns that are not a row's real entries masked, the
  ones after ``end`` included (they are zero and get weight zero);
- a finished row's slot is refilled by moving the last live row into it (one row copied, not the batch);
- joining rows (their queries run over their caches, ``generation``) are written into the free slots, ending at
  ``end``, zero before their first entry, so no stale value (a NaN eviction mark included) is ever read;
- the buffers are laid out anew (the live columns copied once, the columns that are padding for every row left
  behind) when the steps reach their last column, when a join needs columns left of the first, or when ``ROOM``
  leading columns are padding for every row.

Every row keeps its attention mask over the buffer's columns (1 on its real entries), the position of its next token
and its next-token logits in ``Running``; the model gets the mask as the additive 4D mask eager attention builds
(``bias``), so it reads the cache as it would a ``DynamicCache`` of the same rows.

The step runs eagerly. Compiled (``benchmarks/compiled_step.py``: ``torch.compile`` with the step's column passed as a
tensor, since ``end`` as an int recompiles every step) it was 4-10% faster on Qwen2.5-Coder-1.5B in bfloat16, but its
logits differ from the eager step's by more than the rounding steps ``fairkv verify`` takes as a near tie, so its rows
would not recompute the committed ones; every process would also compile for about 90 s per kind of shape.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from transformers import DynamicCache
from transformers.cache_utils import DynamicLayer

ROOM = 128  # free columns after the last one written, each time the buffers are laid out


class SlotLayer(DynamicLayer):
    """One layer's keys and values of a running batch, in buffers that each decoding step writes a column into."""

    def __init__(self, keys: torch.Tensor, values: torch.Tensor, rows: int, end: int):
        super().__init__()
        self.kbuf, self.vbuf, self.end = keys, values, end
        self.dtype, self.device, self.is_initialized = keys.dtype, keys.device, True
        self.live(rows)

    def live(self, rows: int) -> None:
        self.keys, self.values = self.kbuf[:rows], self.vbuf[:rows]

    def update(self, key_states: torch.Tensor, value_states: torch.Tensor, cache_kwargs=None):
        if key_states.shape[-2] != 1 or self.end >= self.kbuf.shape[2]:
            raise ValueError("a running batch takes one token per row and step, within its columns")
        self.keys[:, :, self.end] = key_states[:, :, 0]
        self.values[:, :, self.end] = value_states[:, :, 0]
        self.end += 1
        return self.keys, self.values

    def get_seq_length(self) -> int:
        return self.end

    def get_mask_sizes(self, cache_position: torch.Tensor) -> tuple[int, int]:
        return self.kbuf.shape[2], 0


@dataclass
class Running:
    """Sequences decoding together: their cache (a ``SlotLayer`` per layer), each row's attention mask over the
    buffers' columns, the position of its next token, its next-token logits and the key of the item it answers."""

    cache: DynamicCache
    mask: torch.Tensor  # (rows, columns): 1 on real entries
    positions: torch.Tensor  # (rows, 1)
    logits: torch.Tensor  # (rows, vocab)
    items: list

    @property
    def end(self) -> int:
        return self.cache.layers[0].end

    @classmethod
    def open(cls, capacity: int, cache: DynamicCache, mask, positions, logits, items: list) -> "Running":
        """A running batch of at most ``capacity`` rows holding the rows of ``cache`` (a prefilled ``DynamicCache``
        whose attention mask is ``mask``)."""
        slots = DynamicCache()
        width = mask.shape[1]
        for layer in cache.layers:
            shape = (capacity, layer.keys.shape[1], width + ROOM, layer.keys.shape[3])
            slots.layers.append(SlotLayer(layer.keys.new_zeros(shape), layer.values.new_zeros(shape), 0, width))
        running = cls(slots, mask.new_zeros(0, width + ROOM), positions[:0], logits[:0], [])
        running.join(cache, mask, positions, logits, items)
        return running

    def join(self, cache: DynamicCache, mask, positions, logits, items: list) -> None:
        """Add the rows of ``cache`` (a prefilled ``DynamicCache`` whose attention mask is ``mask``) in free slots."""
        width = mask.shape[1]
        if width > self.end:
            self.lay_out(lead=width - self._width())
        rows, start = len(self.items), self.end - width
        for layer, new in zip(self.cache.layers, cache.layers):
            for buffer, values in ((layer.kbuf, new.keys), (layer.vbuf, new.values)):
                buffer[rows : rows + len(items), :, :start] = 0
                buffer[rows : rows + len(items), :, start : self.end] = values
            layer.live(rows + len(items))
        joined = mask.new_zeros(len(items), self.mask.shape[1])
        joined[:, start : self.end] = mask
        self.mask = torch.cat([self.mask, joined])
        self.positions = torch.cat([self.positions, positions])
        self.logits = torch.cat([self.logits, logits])
        self.items += items

    def step(self) -> torch.Tensor:
        """Make room for one more column; the additive attention mask of the step (rows, 1, 1, columns)."""
        if self.end >= self.mask.shape[1]:
            self.lay_out()
        self.mask[:, self.end] = 1
        dtype = self.cache.layers[0].kbuf.dtype
        bias = torch.zeros(self.mask.shape, dtype=dtype, device=self.mask.device)
        return bias.masked_fill_(self.mask == 0, torch.finfo(dtype).min)[:, None, None, :]

    def drop(self, finished: list[int]) -> torch.Tensor:
        """Free the slots of rows ``finished``: the last live rows move into them. Returns the old row of each
        remaining row, in its new order."""
        live = len(self.items) - len(finished)
        gone = set(finished)
        holes = [row for row in finished if row < live]
        movers = [row for row in range(live, len(self.items)) if row not in gone]
        order = list(range(live))
        for hole, mover in zip(holes, movers):
            order[hole] = mover
        if holes:
            device = self.mask.device
            source, target = torch.tensor(movers, device=device), torch.tensor(holes, device=device)
            for layer in self.cache.layers:
                for buffer in (layer.kbuf, layer.vbuf):
                    buffer[target, :, : self.end] = buffer[source, :, : self.end]
        for layer in self.cache.layers:
            layer.live(live)
        index = torch.tensor(order, device=self.mask.device)
        self.mask, self.positions, self.logits = self.mask[index], self.positions[index], self.logits[index]
        self.items = [self.items[row] for row in order]
        if self._first() >= ROOM:
            self.lay_out()
        return index

    def _first(self) -> int:
        """The first column that is a real entry of some row."""
        return int(self.mask[:, : self.end].any(dim=0).int().argmax())

    def _width(self) -> int:
        return self.end - self._first()

    def lay_out(self, lead: int = 0) -> None:
        """New buffers holding the live columns after ``lead`` free ones, with ``ROOM`` free columns after them."""
        first, end, rows = self._first(), self.end, len(self.items)
        width = end - first
        columns = lead + width + ROOM
        for layer in self.cache.layers:
            for name in ("kbuf", "vbuf"):
                old = getattr(layer, name)
                new = old.new_zeros((old.shape[0], old.shape[1], columns, old.shape[3]))
                new[:rows, :, lead : lead + width] = old[:rows, :, first:end]
                setattr(layer, name, new)
            layer.end = lead + width
            layer.live(rows)
        mask = self.mask.new_zeros(rows, columns)
        mask[:, lead : lead + width] = self.mask[:, first : first + width]
        self.mask = mask

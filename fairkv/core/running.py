"""The running batch of decoding: sequences that decode together, in a cache of slots allocated ahead.

A ``DynamicCache`` concatenates every decoding step's keys and values onto the whole cache (a copy of all of it, every
layer, every step), and dropping a finished row selects the remaining rows (another copy of all of it). On long
answers these copies cost more than the model (``benchmarks/decode_breakdown.py``: at 128 rows and 1000 cached
tokens a step took 3.0 s against 1.4 s at 100 tokens, and dropping one row 1.35 s). Here each layer keeps its keys
and values in buffers of (capacity rows, kv heads, columns, head dim) (``SlotLayer``):

- a step writes its one column into the buffers; ``keys`` / ``values`` are views of the live rows and columns
  (``[:rows, :, first:end]``), which attention reads in place;
- a finished row's slot is refilled by moving the last live row into it (one row copied, not the batch);
- rows are left-padded: every row's next token goes in column ``end``; columns that are padding for every live row are
  dropped by moving ``first``, not by copying;
- joining rows (their queries run over their caches, ``generation``) are written into the free slots, ending at
  ``end``; their padding columns are zeroed, so no stale value (a NaN eviction mark included) is ever read;
- the buffers are laid out anew, the window copied once, only when a join needs columns left of it or the steps run
  past its right end (room for ``ROOM`` more steps each time).

Every row keeps its own attention mask (1 on its real entries), positions and next-token logits in ``Running``.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from transformers import DynamicCache
from transformers.cache_utils import DynamicLayer

ROOM = 256  # columns laid out right of the window for the steps to come, each time the buffers are laid out


class SlotLayer(DynamicLayer):
    """One layer's keys and values of a running batch, in buffers that decoding writes into (see the module)."""

    def __init__(self, keys: torch.Tensor, values: torch.Tensor, rows: int, first: int, end: int):
        super().__init__()
        self.kbuf, self.vbuf, self.rows, self.first, self.end = keys, values, rows, first, end
        self.dtype, self.device, self.is_initialized = keys.dtype, keys.device, True
        self.view()

    def view(self) -> None:
        self.keys = self.kbuf[: self.rows, :, self.first : self.end]
        self.values = self.vbuf[: self.rows, :, self.first : self.end]

    def update(self, key_states: torch.Tensor, value_states: torch.Tensor, cache_kwargs=None):
        n = key_states.shape[-2]
        if self.end + n > self.kbuf.shape[2]:
            self.lay_out(0, n + ROOM)
        self.kbuf[: self.rows, :, self.end : self.end + n] = key_states
        self.vbuf[: self.rows, :, self.end : self.end + n] = value_states
        self.end += n
        self.view()
        return self.keys, self.values

    def lay_out(self, left: int, right: int) -> None:
        """New buffers with ``left`` free columns before the window and ``right`` after it."""
        width = self.end - self.first
        shape = (*self.kbuf.shape[:2], left + width + right, self.kbuf.shape[3])
        for name in ("kbuf", "vbuf"):
            old = getattr(self, name)
            new = old.new_zeros(shape)
            new[: self.rows, :, left : left + width] = old[: self.rows, :, self.first : self.end]
            setattr(self, name, new)
        self.first, self.end = left, left + width
        self.view()

    def write(self, rows: slice, keys: torch.Tensor, values: torch.Tensor) -> None:
        """Rows ``rows`` become ``keys`` / ``values`` (ending at ``end``), zero in the window's columns before them."""
        start = self.end - keys.shape[2]
        for buffer, new in ((self.kbuf, keys), (self.vbuf, values)):
            buffer[rows, :, self.first : start] = 0
            buffer[rows, :, start : self.end] = new

    def move(self, source: torch.Tensor, target: torch.Tensor) -> None:
        """Rows ``source`` copied into slots ``target`` (the window's columns)."""
        for buffer in (self.kbuf, self.vbuf):
            buffer[target, :, self.first : self.end] = buffer[source, :, self.first : self.end]


@dataclass
class Running:
    """Sequences decoding together: their cache (``SlotLayer`` per layer), attention mask over the cache's window,
    the position of each row's next token, its next-token logits and the key of the item each row answers."""

    cache: DynamicCache
    mask: torch.Tensor  # (rows, window): 1 on real entries, 0 on left padding
    positions: torch.Tensor  # (rows, 1)
    logits: torch.Tensor  # (rows, vocab)
    items: list

    @classmethod
    def open(cls, capacity: int, cache: DynamicCache, mask, positions, logits, items: list) -> "Running":
        """A running batch of at most ``capacity`` rows holding the rows of ``cache`` (a prefilled ``DynamicCache``)."""
        slots = DynamicCache()
        width = mask.shape[1]
        for layer in cache.layers:
            keys, values = layer.keys, layer.values
            shape = (capacity, keys.shape[1], width + ROOM, keys.shape[3])
            slot = SlotLayer(keys.new_zeros(shape), values.new_zeros(shape), len(items), 0, width)
            slot.write(slice(0, len(items)), keys, values)
            slots.layers.append(slot)
        return cls(slots, mask, positions, logits, list(items))

    def join(self, cache: DynamicCache, mask, positions, logits, items: list) -> None:
        """Add the rows of ``cache`` (a prefilled ``DynamicCache`` whose mask is ``mask``) in the free slots."""
        rows, width = len(self.items), mask.shape[1]
        wider = width - self.mask.shape[1]
        for layer, new in zip(self.cache.layers, cache.layers):
            if wider > layer.first:
                layer.lay_out(wider, ROOM)
            if wider > 0:
                layer.first -= wider
                layer.kbuf[:rows, :, layer.first : layer.first + wider] = 0
                layer.vbuf[:rows, :, layer.first : layer.first + wider] = 0
            layer.rows = rows + len(items)
            layer.write(slice(rows, layer.rows), new.keys, new.values)
            layer.view()
        length = max(width, self.mask.shape[1])
        pad = lambda m: torch.nn.functional.pad(m, (length - m.shape[1], 0))
        self.mask = torch.cat([pad(self.mask), pad(mask)])
        self.positions = torch.cat([self.positions, positions])
        self.logits = torch.cat([self.logits, logits])
        self.items += items

    def drop(self, finished: list[int]) -> torch.Tensor:
        """Free the slots of rows ``finished``: the last live rows move into them, then the columns that are padding
        for every remaining row leave the window. Returns the old row of each remaining row, in its new order."""
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
                layer.move(source, target)
        index = torch.tensor(order, device=self.mask.device)
        self.mask, self.positions, self.logits = self.mask[index], self.positions[index], self.logits[index]
        self.items = [self.items[row] for row in order]
        first = int(self.mask.any(dim=0).int().argmax())
        self.mask = self.mask[:, first:]
        for layer in self.cache.layers:
            layer.rows, layer.first = live, layer.first + first
            layer.view()
        return index

# SPDX-License-Identifier: Apache-2.0
"""The pre-lookahead layer: each token's features see the next `L` tokens (reference `PreLookaheadLayer`).

Shared by both flows: Step-Audio2's conformer encoder (`encoder.pre_lookahead_layer`, 512 -> 512 -> 512)
and CosyVoice3's flow, where it is the whole token encoder (`pre_lookahead_layer`, 80 -> 1024 -> 80):

    y = conv2(pad_left_2(leaky_relu(conv1(x ++ lookahead)))) + x,   conv1 kernel L + 1, conv2 kernel 3

Output position i therefore depends on inputs i-2 .. i+L. At the start the two missing conv1 OUTPUTS
are zeros (conv1 has a bias, so this is not the same as zero inputs); at the end of an utterance the
missing lookahead INPUTS are zeros. Three ways to run it, equal where their inputs overlap:
- `forward(x)`: a whole utterance (zero lookahead at the end);
- `forward_window(x, history=h, lookahead_pad=p)`: any span, given up to 2 positions of history
  before it and the real lookahead after it (CosyVoice3 streaming, and its `context=` calls);
- `forward_chunk(x, cache)`: Step-Audio2 streaming with the last two conv1 outputs as the cache.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

#: conv1 outputs before an output position that conv2 (kernel 3) reads.
HISTORY = 2


class PreLookaheadLayer(nn.Module):
    """Residual `conv2(leaky_relu(conv1(x)))` where conv1 sees `pre_lookahead_len` future positions.

    `channels` is conv1's output width; `in_channels` (default `channels`) is the input and output width.
    """

    def __init__(
        self,
        channels: int,
        pre_lookahead_len: int = 1,
        *,
        in_channels: int | None = None,
        dtype: torch.dtype = torch.float32,
    ) -> None:
        super().__init__()
        in_channels = channels if in_channels is None else in_channels
        self.in_channels = in_channels
        self.channels = channels
        self.pre_lookahead_len = pre_lookahead_len
        self.conv1 = nn.Conv1d(in_channels, channels, kernel_size=pre_lookahead_len + 1, dtype=dtype)
        self.conv2 = nn.Conv1d(channels, in_channels, kernel_size=3, dtype=dtype)

    def forward(self, inputs: torch.Tensor) -> torch.Tensor:
        """inputs `(B, T, C)`, a whole utterance -> `(B, T, C)`."""
        return self.forward_window(inputs, history=0, lookahead_pad=self.pre_lookahead_len)

    def forward_window(self, inputs: torch.Tensor, *, history: int, lookahead_pad: int) -> torch.Tensor:
        """Output at the positions `inputs[:, history : T - L + lookahead_pad]`.

        inputs `(B, T, C)`: `history` (0..2) positions before the first output position (fewer than 2
        only at the utterance start), the output positions, then the `L - lookahead_pad` real lookahead
        positions; the `lookahead_pad` missing ones (utterance end) count as zeros.
        """
        if not 0 <= history <= HISTORY or not 0 <= lookahead_pad <= self.pre_lookahead_len:
            raise ValueError(
                f"PreLookaheadLayer.forward_window: history={history} (0..{HISTORY}) and "
                f"lookahead_pad={lookahead_pad} (0..{self.pre_lookahead_len}) out of range"
            )
        x = F.pad(inputs.transpose(1, 2), (0, lookahead_pad))
        x = F.leaky_relu(self.conv1(x))
        x = self.conv2(F.pad(x, (HISTORY - history, 0)))
        return x.transpose(1, 2) + inputs[:, history : history + x.size(2)]

    def forward_chunk(
        self, inputs: torch.Tensor, cache: torch.Tensor | None = None
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """inputs `(B, T, C)` ending in the lookahead, cache `(B, C', 2)` -> (`(B, T - L, C)`, new cache)."""
        x = F.leaky_relu(self.conv1(inputs.transpose(1, 2)))
        if cache is None:
            cache = x.new_zeros(x.size(0), x.size(1), HISTORY)
        new_cache = x[..., -HISTORY:]
        x = self.conv2(torch.cat([cache, x], dim=2))
        return x.transpose(1, 2) + inputs[:, : inputs.size(1) - self.pre_lookahead_len], new_cache

"""Resuming a sample stream: :mod:`.state` (one consumer's position), :mod:`.delivery` (what
a plain DataLoader delivered), :mod:`.regroup` (an epoch's rest for a new consumer count)
and :mod:`.resumption` (every kind of state as the one object an iteration starts from)."""

"""Units shared by every package: one definition each."""

GIB = 2**30  # bytes in a GiB (IEC binary gibibyte); every *_gib property uses it

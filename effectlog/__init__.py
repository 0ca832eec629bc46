"""effectlog: the truth about external side effects performed by workers."""

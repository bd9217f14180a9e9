"""Wire protocol shared by the broker and its clients."""

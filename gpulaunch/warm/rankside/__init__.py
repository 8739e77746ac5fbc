"""What runs in the warm process, not in the launcher: `server.py`, run by its path.

It is started with the ranks' own Python (`python -u server.py`, by its full path), so this
folder is its `sys.path[0]` while it imports torch; it holds nothing else that an import
could find by mistake. It may import torch; the launcher never imports it.
"""

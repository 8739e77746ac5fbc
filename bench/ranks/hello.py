"""Scenario 3: print one line and exit (nothing imported but os)."""

import os

os.write(1, f"hello r={os.environ['RANK']}\n".encode())

#!/bin/sh
# A rank that is not Python (py-spy cannot read its stacks): `--dir DIR`, marks itself
# ready there, then sleeps.
touch "$2/rank$RANK.ready"
exec sleep 300

"""Write this rank's environment as JSON: the same script under torchrun and gpulaunch."""

import json
import os
import sys

out = sys.argv[sys.argv.index("--out") + 1]
with open(os.path.join(out, f"env{os.environ['RANK']}.json"), "w") as f:
    json.dump(dict(os.environ), f)

"""The job's systemd units: templates, rendering and the D-Bus codec.

- `templates.py`: finding and rendering the unit templates (`templates/`), trusted by
  `trust.py`, with the variables of `variables.py`;
- `job.py`: the units of one job, rendered from one typed set of template variables,
  as `definitions.py`'s types;
- `guarantees.py`: the settings a template may not take away;
- `codec.py`, `values.py`: unit-file text → typed D-Bus properties.

Job ids → unit names: gpulaunch/base/names.py.
"""

"""The job's systemd units: names, templates, rendering and the D-Bus codec.

- `names`: job ids → unit names (systemd's escaping, injective);
- `templates`: finding and rendering the unit templates (`templates/`);
- `job`: the units of one job, rendered from one typed set of template variables;
- `codec`, `values`: unit-file text → typed D-Bus properties.
"""

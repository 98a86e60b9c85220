"""The staging study: `mlhpc stage-bench` (bench.py), its measuring tools (tools.py) and the
paper model of staging at scale (model.py). Apart from the product so that nothing staging
does at run time imports it."""

"""Writes the generated pages into the site at build time (mkdocs-gen-files runs this).

The reference pages come from the code (``faultlab.reference``): the fault registry, the SLA
registry and the metrics' definitions, the experiment models and the CLI's parsers. The JSON
Schema of experiment files is served beside them (``faultlab schema`` prints the same).
"""

import json

import mkdocs_gen_files

from faultlab import reference
from faultlab.spec.schema import document_schema

PAGES = {
    "reference/faults.md": reference.faults_page,
    "reference/slas.md": reference.slas_page,
    "reference/experiment-yaml.md": reference.yaml_page,
    "reference/cli.md": reference.cli_page,
}

for path, render in PAGES.items():
    with mkdocs_gen_files.open(path, "w") as f:
        f.write(render())

with mkdocs_gen_files.open("schema/faultlab.schema.json", "w") as f:
    f.write(json.dumps(document_schema(), indent=2, ensure_ascii=False) + "\n")

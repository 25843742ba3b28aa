"""Sphinx configuration for nsqclient's documentation."""

import os
import sys

sys.path.insert(0, os.path.abspath(".."))

project = "nsqclient"
author = "nsqclient developers"
extensions = ["sphinx.ext.autodoc", "sphinx.ext.napoleon"]
autodoc_member_order = "bysource"
autodoc_typehints = "description"
exclude_patterns = ["_build"]
html_theme = "alabaster"
nitpicky = False

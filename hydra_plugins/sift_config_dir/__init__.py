"""Hydra search-path plugin of sift: a user's ``--config-dir`` overrides sift's packaged configs.

Hydra's own ``--config-dir`` is searched *after* the application's config folder, so a user's
``detector/sift.yaml`` would never win over the shipped one. sift's commands take ``--config-dir DIR``
themselves (:func:`sift.cli._common.sift_main`), export it as ``SIFT_CONFIG_DIR`` (inherited by worker
processes and cluster jobs), and this plugin puts that folder in front of sift's configs.
"""

from __future__ import annotations

import os

from hydra.core.config_search_path import ConfigSearchPath, SearchPathQuery
from hydra.plugins.search_path_plugin import SearchPathPlugin

ENV = "SIFT_CONFIG_DIR"


class SiftUserConfigDir(SearchPathPlugin):
    """Prepend ``$SIFT_CONFIG_DIR`` to the search path of an app whose main config folder is sift's."""

    def manipulate_search_path(self, search_path: ConfigSearchPath) -> None:
        user = os.environ.get(ENV)
        if not user:
            return
        from sift.resources import config_dir

        ours = os.path.realpath(config_dir())
        mains = [e.path.removeprefix("file://") for e in search_path.get_path() if e.provider == "main"]
        if not any(os.path.realpath(p) == ours for p in mains):
            return  # another Hydra app: leave its search path alone
        search_path.prepend("sift-user", f"file://{os.path.abspath(user)}", anchor=SearchPathQuery(provider="main"))

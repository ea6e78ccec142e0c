"""Export a query's selection: as a new LeRobot v3.0 dataset (:func:`export_dataset`, ``Database.export``) or as a
Parquet manifest (:func:`export_manifest`, ``Database.export_manifest``).

The public face of the package only; the work is in its modules:

* :mod:`.lerobot`: the dataset-export driver (parts -> writers -> meta/episodes, tasks, stats.json, info.json, the
  marker ``meta/lerobot_sql_export.json``), for one dataset (:func:`export_dataset`) or a collection's selection
  (:func:`export_collection`, ``Collection.export``: the same driver over several sources);
* :mod:`.parts`: how the selection is cut into output episodes and files;
* :mod:`.data_writer`, :mod:`.video_writer`: the Parquet and mp4 writers;
* :mod:`.target`: what the writers take: each source read (``ExportSource``) and the folder written (``ExportTarget``);
* :mod:`.episode_stats`: the statistics columns of meta/episodes between Arrow and numpy (lerobot's statistics
  themselves are :mod:`lerobot_sql._format.stats_json`'s);
* :mod:`.manifest_file`: the manifest as one Parquet file (its form: :mod:`lerobot_sql._plan.manifest`);
* :mod:`.destination`: where an export may write (never over what it did not write), the staging folder's life
  until it is moved into place, and the one error block around the writes.
"""

from __future__ import annotations

from .._plan.manifest import dataset_identity
from .destination import MARKER
from .lerobot import ExportReport, export_collection, export_dataset
from .manifest_file import ManifestReport, export_manifest

__all__ = ["export_dataset", "export_collection", "export_manifest", "ExportReport", "ManifestReport",
           "dataset_identity", "MARKER"]

"""Export a query's selection: as a new LeRobot v3.0 dataset (:func:`export_dataset`, ``Database.export``) or as a
Parquet manifest (:func:`export_manifest`, ``Database.export_manifest``).

The public face of the package only; the work is in its modules:

* :mod:`.lerobot`: the dataset-export driver (parts -> writers -> meta/episodes, tasks, stats.json, info.json, the
  marker ``meta/lerobot_sql_export.json``), for one dataset (:func:`export_dataset`) or a collection's selection
  (:func:`export_collection`, ``Collection.export``: the same driver over several sources);
* :mod:`.parts`: how the selection is cut into output episodes and files;
* :mod:`.data_writer`, :mod:`.video_writer`: the Parquet and mp4 writers;
* :mod:`.stats`: the ports of lerobot's compute_stats / aggregate_stats;
* :mod:`.manifest`: the manifest as one Parquet file, and the dataset identity it carries;
* :mod:`.destination`: where an export may write (never over what it did not write) and its one error block.
"""

from __future__ import annotations

from .destination import MARKER
from .lerobot import ExportReport, export_collection, export_dataset
from .manifest import ManifestReport, dataset_identity, export_manifest

__all__ = ["export_dataset", "export_collection", "export_manifest", "ExportReport", "ManifestReport",
           "dataset_identity", "MARKER"]

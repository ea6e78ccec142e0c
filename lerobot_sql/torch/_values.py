"""lerobot's value conventions: how a stored value becomes the tensor (or Python value) an item carries.

Images stored in Parquet (PNG/TIFF cells) as lerobot's ``ToTensor`` gives them; video frames as float32 in [0, 1]
(bit for bit lerobot's ``float32 / 255``); depth maps as lerobot 0.6 serves them (12-bit codes dequantized with its
own torch ops in its order, recorded units converted to ``depth_output_unit``); a query's extra columns with their
Arrow dtypes kept; where height and width sit in a camera's info.json shape. Item assembly
(:mod:`lerobot_sql.torch.dataset`) and batches call these; the depth constants come from
:mod:`lerobot_sql._format.depth`.
"""

from __future__ import annotations

import io
import math
from typing import Callable

import numpy as np
import pyarrow as pa
import torch

from .._format import depth
from ..errors import DatasetFormatError, warn


# ---- numbers ---------------------------------------------------------------------------------------------------
def is_number(t: pa.DataType) -> bool:
    return pa.types.is_integer(t) or pa.types.is_floating(t) or pa.types.is_boolean(t)


def torch_dtype(t: pa.DataType) -> torch.dtype:
    """The torch dtype holding Arrow number type ``t`` exactly (float16/32/64, int8..64, uint8, bool; wider
    unsigned ints as int64, which holds every count a query gives)."""
    np_dtype = np.dtype(t.to_pandas_dtype())
    if np_dtype.kind == "u" and np_dtype.itemsize > 1:
        np_dtype = np.dtype(np.int64)
    return np_torch(np_dtype)


def np_torch(dtype: np.dtype) -> torch.dtype:
    """The torch dtype ``torch.from_numpy`` gives an array of numpy ``dtype``."""
    return torch.from_numpy(np.zeros(0, dtype)).dtype


def to_unit_float(arr: np.ndarray) -> np.ndarray:
    """float32(u8) / 255, bit for bit what lerobot's ``frames.type(torch.float32) / 255`` gives (IEEE division is
    correctly rounded in both). numpy runs it on the calling thread: torch would hand a 36k-element op to its
    intra-op pool, whose wake-ups cost milliseconds on a busy 2-core machine."""
    return np.true_divide(arr, np.float32(255), dtype=np.float32)


# ---- a query's extra columns -----------------------------------------------------------------------------------
def extra_columns(manifest: pa.Table, extras: list[str]) -> list[tuple[str, object, bool, torch.dtype | None]]:
    """Per extra column of ``manifest``: ``(name, values, numeric, list dtype)``. ``values`` is a numpy array for a
    number column without NULLs (``numeric``: its items are 0-d tensors of that dtype), else the Arrow array (items
    take :func:`extra_value` of its Python values); ``list dtype`` is the torch dtype of a list of numbers'
    elements, else None.

    Each extra keeps its Arrow dtype (float64 stays float64, int64 int64): a float32 tensor would round 123456789
    to 123456792 and a Unix time to 1.7e9. A number column with NULLs is float64 with NaN already
    (``_plan``'s plain numbers); here such a column (a manifest written elsewhere) is made so too."""
    out = []
    for e in extras:
        col = manifest[e]
        col = col.chunk(0) if col.num_chunks == 1 else col.combine_chunks()
        if is_number(col.type) and col.null_count:
            col = col.cast(pa.float64()).fill_null(float("nan"))
        numeric = is_number(col.type) and col.null_count == 0
        inner = getattr(col.type, "value_type", None)
        ltype = torch_dtype(inner) if inner is not None and is_number(inner) else None
        out.append((e, col.to_numpy(zero_copy_only=False) if numeric else col, numeric, ltype))
    return out


def extra_value(v, ltype: torch.dtype | None):
    """A query's non-numeric extra column value as an item carries it: a list of numbers as a 1-D tensor of the
    list's value dtype (NULL elements become NaN, as float64); anything else (text, None, other lists) as is."""
    if isinstance(v, list) and v and all(isinstance(x, (int, float, bool)) for x in v):
        return torch.tensor(v, dtype=ltype) if ltype is not None else torch.tensor(v)
    if isinstance(v, list) and v and ltype is not None and all(x is None or isinstance(x, (int, float)) for x in v):
        return torch.tensor([float("nan") if x is None else x for x in v], dtype=torch.float64)
    return v


# ---- camera shapes ---------------------------------------------------------------------------------------------
def hw_axes(feature) -> tuple[int, int] | None:
    """The axes of height and width in a camera feature's info.json shape: [H, W, C] (lerobot's) -> (0, 1), or
    [C, H, W] when its names start with a channel, or, without names, when only the first side looks like a channel
    count (older writers) -> (1, 2); [H, W] -> (0, 1); None when the shape says nothing usable."""
    shape = [int(x) for x in feature.shape if isinstance(x, (int, np.integer))]
    if len(shape) != len(feature.shape) or len(shape) not in (2, 3):
        return None
    if len(shape) == 2:
        return 0, 1
    names = feature.names if isinstance(feature.names, list) else []
    chw = str(names[0]).startswith("channel") if names else shape[0] in (1, 3, 4) and shape[2] not in (1, 3, 4)
    return (1, 2) if chw else (0, 1)


def declared_hw(feature) -> set[tuple[int, int]] | None:
    """The (height, width) a camera feature's info.json shape allows (axes: :func:`hw_axes`); None when the shape
    says nothing usable (then no check)."""
    axes = hw_axes(feature)
    if axes is None:
        return None
    return {(int(feature.shape[axes[0]]), int(feature.shape[axes[1]]))}


# ---- depth maps ------------------------------------------------------------------------------------------------
def depth_unit(feature) -> str | None:
    """The recorded unit of depth image ``feature`` ("mm" / "m"), or None (lerobot returns the values as they are,
    and warns; so does this, once per dataset).

    Raises:
        DatasetFormatError: ``info.depth_unit`` is something else (lerobot would divide it by 1000 as if mm).
    """
    unit = feature.depth_unit
    if unit is None:
        warn(f"depth map {feature.name!r} has no info.depth_unit in meta/info.json: its values are returned "
             "as stored, not converted to depth_output_unit (as lerobot 0.6 does); set depth_unit to "
             "'mm' or 'm' to convert them")
    elif unit not in depth.UNITS:
        raise DatasetFormatError(f"depth map {feature.name!r}: info.depth_unit is {unit!r}; lerobot 0.6 knows 'mm' "
                                 "and 'm' only. Fix it in meta/info.json")
    return unit


def dequantize_(buf: torch.Tensor, q: dict, unit: str) -> torch.Tensor:
    """lerobot 0.6.1's ``dequantize_depth`` (its torch path, which its reader takes), in place on ``buf``: float32
    12-bit codes, any shape, become depth in ``unit`` ("mm": whole millimetres, float32; "m": metres).

    Op for op as lerobot (``mul_(scale).add_(offset)``, ``exp_().sub_(shift)`` with ``use_log``, ``clamp_(min,
    max)``, then for mm ``mul_(1000).round_().clamp_(0, 65535)``), with the scale and offset computed in Python
    floats as there: the same torch kernels give the same float32 bits (numpy's scalar promotion and its exp are
    other code, never checked equal). Checked against lerobot's items: tests/test_dataset.py."""
    lo, hi, shift = float(q["depth_min"]), float(q["depth_max"]), float(q["shift"])
    if q["use_log"]:
        log_min, log_max = math.log(lo + shift), math.log(hi + shift)
        scale, offset = (log_max - log_min) / depth.QMAX, log_min
    else:
        scale, offset = (hi - lo) / depth.QMAX, lo
    buf.mul_(scale).add_(offset)
    if q["use_log"]:
        buf.exp_().sub_(shift)
    buf.clamp_(lo, hi)
    if unit == "m":
        return buf
    return buf.mul_(depth.MM_PER_METRE).round_().clamp_(0.0, depth.MM_MAX)


# ---- image cells -----------------------------------------------------------------------------------------------
class ImageCells:
    """How a dataset's image cells (lerobot's ``{bytes, path}`` structs of PNG/TIFF bytes) become item tensors:
    the declared frame sizes, and which columns are depth maps with their recorded units."""

    def __init__(self, layout, depth_units: dict[str, str | None]):
        self._layout = layout
        self.hw = {k: declared_hw(layout.features[k]) for k in layout.image_keys}
        self.depth_units = depth_units  # depth image column -> its recorded unit (None: served as stored)

    def tensor(self, value, column: str, fail: Callable[[str], Exception], *, uint8: bool, unit: str) -> torch.Tensor:
        """Decode one cell of image column ``column``.

        Returns lerobot's tensor (``ToTensor``): float32 (C, H, W) in [0, 1], uint8 with ``uint8``
        (``return_uint8``); 16-bit images as their integer values, (1, H, W); a depth map (``info.is_depth_map``)
        as lerobot 0.6: float32 (1, H, W) of its values (uint16 mm or float m TIFF), converted from
        ``info.depth_unit`` to ``unit`` (``depth_output_unit``: x1000 or /1000).

        Raises:
            ``fail(what)`` (a DatasetFormatError naming the file and sample): the cell has no bytes (only a path,
                which is never opened: it is dataset text), is not an image PIL can read, or its header's size is
                not the declared one (checked before the pixels are decoded, so a small PNG declaring 12000 x
                12000 costs nothing). lerobot would serve any size; a refusal here keeps batches and model inputs
                at the declared shape.
        """
        from PIL import Image

        raw = value.as_py() if hasattr(value, "as_py") else value
        data = raw.get("bytes") if isinstance(raw, dict) else raw
        if not isinstance(data, (bytes, bytearray, memoryview)):
            raise fail("holds no image bytes" + (
                " (only a path, which is not opened: re-encode the dataset with the images embedded)"
                if isinstance(raw, dict) and raw.get("path") else ""))
        try:
            img = Image.open(io.BytesIO(data))  # lazy: reads the header only
            want = self.hw.get(column)
            if want is not None and (img.height, img.width) not in want:
                raise fail(f"is a {img.width}x{img.height} (WxH) {img.mode} image but info.json declares shape "
                           f"{list(self._layout.features[column].shape)} for {column!r}; fix the image or the "
                           "declared shape")
            arr = np.asarray(img)
        except DatasetFormatError:
            raise
        except Exception as e:  # PIL: UnidentifiedImageError, a truncated stream (OSError), DecompressionBombError
            raise fail(f"is not a readable image ({type(e).__name__}: {e})") from e
        if arr.ndim == 2:
            arr = arr[:, :, None]
        arr = np.ascontiguousarray(arr.transpose(2, 0, 1))
        if column in self.depth_units:
            # lerobot 0.6 (pil_to_chw_tensor): a 16-bit depth image as float32 values, a float TIFF as it is
            # (ToTensor keeps mode F); then from its recorded unit to the output unit, with the same torch op
            if arr.dtype == np.uint16 or not arr.flags.writeable:  # PIL's float array is read-only: copy it
                arr = arr.astype(np.float32 if arr.dtype == np.uint16 else arr.dtype)
            t = torch.from_numpy(arr)
            recorded = self.depth_units[column]
            if recorded is not None and recorded != unit:
                t = t * depth.MM_PER_METRE if recorded == "m" else t / depth.MM_PER_METRE
            return t
        if arr.dtype == np.uint8 and not uint8:
            arr = to_unit_float(arr)
        return torch.from_numpy(arr)

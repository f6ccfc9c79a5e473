"""The one place where tf.data's element structures meet the engine's flat, named fields: a
dataset's elements are scalars, tuples, dicts, nested as the user built them, while every stage
sees a dict of fields (item i of a tuple is field "i", key b of a dict under a is field "a/b",
one value alone is field "value"). Also what tf.data converts Python values to (lists of ints to
int32, of floats to float32), and its TensorSpec."""
import collections

import numpy


class TensorSpec(collections.namedtuple("TensorSpec", "shape dtype name")):
    """One field of Dataset.element_spec, and the type of an element for from_generator's
    output_signature, as tf.TensorSpec: a shape (None for a dimension that varies, or for the
    whole shape when the rank does), a NumPy dtype (float32 unless given; bytes or numpy.bytes_
    for text), a name."""
    __slots__ = ()

    def __new__(cls, shape, dtype=numpy.float32, name=None):
        return super().__new__(cls, None if shape is None else tuple(shape), dtype, name)


class TextRows(list):
    """A list of str or bytes that is one tensor of text (a row each), not a structure."""


class Structure:
    """How a dataset's elements map to fields. The template is a field name (one value), a tuple
    or a dict of templates; it is set once the structure is known: at once for the sources, at a
    map's first call for what it returns. `select` structures take their leaves out of elements
    with more fields (TextLineDataset's line of an element that also says its file)."""

    def __init__(self, template=None, select=False):
        self.template = template
        self.select = select

    @staticmethod
    def flatten(value, prefix=""):
        """(fields, template) of a tuple, list or dict of values; (None, None) for anything else."""
        if isinstance(value, (tuple, list)) and not isinstance(value, (TensorSpec, TextRows)):
            fields, template = {}, []
            for i, item in enumerate(value):
                inner, shape = Structure.flatten(item, f"{prefix}{i}/")
                if inner is None:
                    inner, shape = {f"{prefix}{i}": item}, f"{prefix}{i}"
                fields.update(inner)
                template.append(shape)
            return fields, tuple(template)
        if isinstance(value, dict):
            fields, template = {}, {}
            for key, item in value.items():
                inner, shape = Structure.flatten(item, f"{prefix}{key}/")
                if inner is None:
                    inner, shape = {f"{prefix}{key}": item}, f"{prefix}{key}"
                fields.update(inner)
                template[key] = shape
            return fields, template
        return None, None

    @staticmethod
    def of(value):
        """(fields, Structure) of any value: one that is no tuple or dict is field "value"."""
        fields, template = Structure.flatten(value)
        if fields is None:
            return {"value": value}, Structure("value")
        return fields, Structure(template)

    def fields_of(self, value, template=None):
        """The fields of a value in this structure, taken apart as the template says (a list
        where the template has a leaf is one value)."""
        template = self.template if template is None else template
        if isinstance(template, tuple):
            if not isinstance(value, (tuple, list)) or len(value) != len(template):
                raise TypeError(f"{value!r} is not a tuple of {len(template)}")
            fields = {}
            for item, part in zip(value, template):
                fields.update(self.fields_of(item, part))
            return fields
        if isinstance(template, dict):
            if not isinstance(value, dict) or set(value) != set(template):
                raise TypeError(f"{value!r} is not a dict of {sorted(template)}")
            fields = {}
            for key, part in template.items():
                fields.update(self.fields_of(value[key], part))
            return fields
        return {template: value}

    def leaves(self, template=None):
        template = self.template if template is None else template
        if isinstance(template, tuple):
            return [name for item in template for name in self.leaves(item)]
        if isinstance(template, dict):
            return [name for item in template.values() for name in self.leaves(item)]
        return [template]

    def applies_to(self, element):
        if self.template is None or not isinstance(element, dict):
            return False
        if self.select:
            return all(name in element for name in self.leaves())
        return sorted(self.leaves()) == sorted(element)

    def unflatten(self, element, template=None):
        """The element (a dict of fields) in the structure; as it is when its fields are others."""
        if template is None:
            if not self.applies_to(element):
                return element
            template = self.template
        if isinstance(template, tuple):
            return tuple(self.unflatten(element, item) for item in template)
        if isinstance(template, dict):
            return {key: self.unflatten(element, item) for key, item in template.items()}
        return element[template]

    def __eq__(self, other):
        """The same structure (concatenate and sampling keep their inputs' when they agree)."""
        return (type(self) is type(other) and self.template == other.template and self.select == other.select and
                getattr(self, "parts", None) == getattr(other, "parts", None) and getattr(self, "keys", None) == getattr(other, "keys", None))

    __hash__ = None


class ZippedStructure(Structure):
    """zip((a, b))'s elements, or zip({"x": a, "y": b})'s: item k is the fields under "k/", in
    dataset k's own structure."""

    def __init__(self, parts, keys=None):
        super().__init__(None)
        self.parts = parts
        self.keys = keys  # the dict's keys, in order; None for a tuple

    def unflatten(self, element, template=None):
        items = []
        for i, part in enumerate(self.parts):
            prefix = f"{i}/"
            fields = {k[len(prefix):]: v for k, v in element.items() if k.startswith(prefix)}
            items.append(part.unflatten(fields) if part is not None else fields)
        return tuple(items) if self.keys is None else dict(zip(self.keys, items))


def is_plain_dict(template):
    """A template of a dict whose keys are its fields: the engine's own element, no structure."""
    return isinstance(template, dict) and all(k == v for k, v in template.items())


def as_tensor(value):
    """What tf.convert_to_tensor makes of a Python value, as NumPy: a list of ints is int32 (int64
    when a value needs it), of floats float32, text stays text; NumPy values keep their dtype."""
    if isinstance(value, (numpy.ndarray, numpy.generic, bytes, str)) or hasattr(value, "__array_interface__"):
        return value
    if isinstance(value, list) and value and all(isinstance(v, (bytes, str)) for v in value):
        return TextRows(value)  # as given: NumPy's fixed-width bytes would drop trailing NULs
    if isinstance(value, (list, int, float, bool)):
        array = numpy.asarray(value)
        if array.dtype.kind == "i":
            fits = array.size == 0 or (array.min() >= -2**31 and array.max() < 2**31)
            return array.astype(numpy.int32 if fits else numpy.int64)
        if array.dtype.kind == "f":
            return array.astype(numpy.float32)
        return array
    return value


def as_tensors(value):
    """as_tensor on every leaf of tuples and dicts (structure); a list is one tensor."""
    if isinstance(value, tuple):
        return tuple(as_tensors(v) for v in value)
    if isinstance(value, dict):
        return {k: as_tensors(v) for k, v in value.items()}
    return as_tensor(value)


def cast_to_spec(value, spec):
    """A generator's value as output_signature's TensorSpec says (tf.data converts it so)."""
    dtype = spec.dtype
    if dtype in (bytes, str, numpy.bytes_, numpy.str_, object):
        if isinstance(value, str):
            return value.encode()
        if isinstance(value, (list, tuple)):
            return [v.encode() if isinstance(v, str) else v for v in value]
        return value
    return numpy.asarray(value, dtype=dtype)

"""The one converter factory between frozen attrs values and their wire form.

Used by the model (Proxy objects), the providers config (YAML) and the HTTP
wire types (JSON bodies and answers); the OpenAPI document is generated from
the same classes with `schema_of`. It sits at the bottom of the layers so all
three may import it (providers may not import the model).
"""

from egressd.codec.checks import (
    CIDR,
    NON_EMPTY,
    Check,
    Doc,
    SchemaOnly,
    at_least,
    matches,
    max_length,
    min_items,
    not_one_of,
    one_of,
)
from egressd.codec.converter import (
    TYPE_WORDS,
    VALUE_WORDS,
    Codec,
    Problem,
    WireError,
    Words,
)
from egressd.codec.schema import Schema, object_schema, schema_of

__all__ = [
    "CIDR", "NON_EMPTY", "TYPE_WORDS", "VALUE_WORDS", "Check", "Codec", "Doc", "Problem",
    "Schema", "SchemaOnly", "WireError", "Words", "at_least", "matches", "max_length",
    "min_items", "not_one_of", "object_schema", "one_of", "schema_of",
]

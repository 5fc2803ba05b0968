"""The timeline's records stay frozen dataclasses with their columns, whatever builds them
(records.py gives them a cheaper `__init__` than the dataclass's own, and `Record.new`, made in C
where it is built, which must make the very record the class call makes)."""

from __future__ import annotations

import dataclasses
import gc
import os
import pickle
import random
import subprocess
import sys

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from analyzer.timeline import records as r

from .conftest import check_built, needs_built

RECORD_TYPES = (r.Delivery, r.Publish, r.ChannelFacts, r.Violation)


def values(cls, start: int = 0) -> dict:
    return {f.name: start + n for n, f in enumerate(dataclasses.fields(cls))}


@pytest.mark.parametrize("cls", RECORD_TYPES)
def test_fields_are_the_columns_in_order(cls):
    names = tuple(f.name for f in dataclasses.fields(cls))
    assert cls.__slots__ == names == tuple(cls.__annotations__)
    record = cls(**values(cls))
    assert dataclasses.asdict(record) == values(cls)
    assert cls(*values(cls).values()) == record  # positional, as spark_jobs/timeline/wide.py builds them
    assert not hasattr(record, "__dict__")


@pytest.mark.parametrize("cls", RECORD_TYPES)
def test_refuses_changes(cls):
    record = cls(**values(cls))
    first = dataclasses.fields(cls)[0].name
    with pytest.raises(dataclasses.FrozenInstanceError):
        setattr(record, first, "changed")
    with pytest.raises(dataclasses.FrozenInstanceError):
        delattr(record, first)
    # Names that are no field are refused too (the class as well: records.py's __init__ moves it
    # itself); on Python 3.11 a frozen slotted dataclass's __setattr__ raises TypeError for them
    # (its super() names the class from before slots), as it did before that __init__.
    with pytest.raises((dataclasses.FrozenInstanceError, TypeError)):
        record.not_a_field = 1
    with pytest.raises((dataclasses.FrozenInstanceError, TypeError)):
        record.__class__ = object
    assert not hasattr(record, "not_a_field")
    assert type(record) is cls and dataclasses.asdict(record) == values(cls)


@pytest.mark.parametrize("cls", RECORD_TYPES)
def test_binds_arguments_like_the_dataclass(cls):
    kwargs = values(cls)
    first = next(iter(kwargs))
    with pytest.raises(TypeError):
        cls(**{**kwargs, "not_a_field": 1})
    with pytest.raises(TypeError):
        cls(**{name: v for name, v in kwargs.items() if name != first})
    with pytest.raises(TypeError):
        cls(0, **kwargs)


@pytest.mark.parametrize("cls", RECORD_TYPES)
def test_equal_and_hashed_by_type_and_fields(cls):
    record = cls(**values(cls))
    assert record == cls(**values(cls)) and hash(record) == hash(cls(**values(cls)))
    assert record != cls(**values(cls, start=1))
    assert len({record, cls(**values(cls)), cls(**values(cls, start=1))}) == 2
    assert record != tuple(values(cls).values())
    others = [other for other in RECORD_TYPES if other is not cls]
    assert all(record != other(**values(other)) for other in others)


def test_equal_only_to_the_same_type():
    shared = values(r.Delivery)

    @r.record
    class LookAlike:
        __annotations__ = dict(r.Delivery.__annotations__)

    assert LookAlike(**shared) != r.Delivery(**shared)


@pytest.mark.parametrize("cls", RECORD_TYPES)
def test_replace_and_copies(cls):
    record = cls(**values(cls))
    last = dataclasses.fields(cls)[-1].name
    changed = dataclasses.replace(record, **{last: "x"})
    assert type(changed) is cls and getattr(changed, last) == "x" and getattr(record, last) != "x"
    assert pickle.loads(pickle.dumps(record)) == record
    with pytest.raises(dataclasses.FrozenInstanceError):
        setattr(changed, last, "y")


def test_refuses_a_field_with_a_default():
    # records.py's __init__ has no defaults: a field with one would silently become required.
    with pytest.raises(TypeError):
        @r.record
        class WithDefault:
            seq: int = 0


# -- Record.new: records made in C (timeline/_records.c) ------------------------------------------

MADE_IN_C = all(cls.new is not cls for cls in RECORD_TYPES)


MAKER_MISSING = "analyzer/timeline/_records.c is not built (pip install -e . compiles it)"


@pytest.mark.c_twin
def test_new_is_made_in_c_in_ci():
    check_built(MADE_IN_C, MAKER_MISSING)


needs_c = needs_built(MADE_IN_C, MAKER_MISSING)


@needs_c
@pytest.mark.parametrize("cls", RECORD_TYPES)
def test_new_makes_the_record_the_class_makes(cls):
    kwargs = values(cls)
    expected = cls(**kwargs)
    items = list(kwargs.items())
    for made in (cls.new(**kwargs), cls.new(*kwargs.values()), cls.new(*[v for _, v in items[:3]], **dict(items[3:])),
                 cls.new(**dict(reversed(items)))):
        assert type(made) is cls and made == expected and hash(made) == hash(expected)
        assert dataclasses.asdict(made) == kwargs and not hasattr(made, "__dict__")
    with pytest.raises(dataclasses.FrozenInstanceError):
        setattr(made, items[0][0], "changed")


@needs_c
@pytest.mark.parametrize("cls", RECORD_TYPES)
def test_new_refuses_what_the_class_refuses(cls):
    kwargs = values(cls)
    last = list(kwargs)[-1]
    bad_calls = [((), {**kwargs, "not_a_field": 1}), ((), {k: v for k, v in kwargs.items() if k != last}),
                 ((0,), kwargs), (tuple(kwargs.values()) + (0,), {}), ((), {})]
    for args, given_kwargs in bad_calls:
        with pytest.raises(TypeError) as by_class:
            cls(*args, **given_kwargs)
        with pytest.raises(TypeError) as by_new:
            cls.new(*args, **given_kwargs)
        for word in ("unexpected keyword", "missing", "multiple values", "takes"):
            assert (word in str(by_class.value)) == (word in str(by_new.value)), (by_class.value, by_new.value)
        assert by_class.value.args[0].split("(")[0].split(".")[0] == by_new.value.args[0].split("(")[0] == cls.__name__


@needs_c
@settings(max_examples=200, deadline=None)
@given(st.sampled_from(RECORD_TYPES), st.data())
def test_new_binds_any_split_and_order_like_the_class(cls, data):
    names = [f.name for f in dataclasses.fields(cls)]
    field_values = data.draw(st.lists(st.none() | st.integers() | st.text(max_size=4) | st.booleans(),
                                      min_size=len(names), max_size=len(names)))
    positional = data.draw(st.integers(0, len(names)))
    keywords = list(zip(names[positional:], field_values[positional:]))
    random.Random(data.draw(st.integers(0, 2**32))).shuffle(keywords)
    args, kwargs = field_values[:positional], dict(keywords)
    made, expected = cls.new(*args, **kwargs), cls(*args, **kwargs)
    assert type(made) is cls and made == expected and dataclasses.astuple(made) == tuple(field_values)


@needs_c
def test_new_holds_its_values_once():
    value = object()
    before = sys.getrefcount(value)
    made = [r.Violation.new(*([value] * 16)) for _ in range(100)]
    assert sys.getrefcount(value) == before + 1600
    del made
    assert sys.getrefcount(value) == before
    from analyzer.timeline import _records
    with pytest.raises(TypeError, match="not one of its own __slots__"):
        _records.maker(r.Delivery, ("seq", "nope"))


@needs_c
@pytest.mark.parametrize("cls", RECORD_TYPES)
def test_new_leaves_records_of_plain_values_to_reference_counting(cls):
    """A record of ints, strs, bools and None can be in no cycle: the collector does not walk it
    (_untrack.h). One holding anything that may be tracked stays tracked, and a cycle through it is
    still collected."""
    n = len(dataclasses.fields(cls))
    plain = [None, 7, "seven", True, 2**70, 1.5, (1, "x")]
    assert not gc.is_tracked(cls.new(*(plain[i % len(plain)] for i in range(n))))
    assert gc.is_tracked(cls(*range(n)))  # the class call is CPython's: tracked as any slotted object

    class Canary:
        def __del__(self):
            freed.append(True)

    freed = []
    for holder in ([], {}, Canary(), ([],)):
        made = cls.new(*([None] * (n - 1)), holder)
        assert gc.is_tracked(made)
    box = [Canary()]
    box.append(cls.new(*([None] * (n - 1)), box))   # box -> record -> box
    del box, made, holder
    gc.collect()
    assert len(freed) == 2   # the Canary held alone, and the one in the cycle


def test_new_is_the_class_itself_in_pure_python():
    code = ("from analyzer.timeline import records as r; "
            "assert all(c.new is c for c in (r.Delivery, r.Publish, r.ChannelFacts, r.Violation))")
    subprocess.run([sys.executable, "-c", code], check=True, env={**os.environ, "ACKSCOPE_PURE_PYTHON": "1"})

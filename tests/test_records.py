"""The timeline's records stay frozen dataclasses with their columns, whatever builds them
(records.py gives them a cheaper `__init__` than the dataclass's own)."""

from __future__ import annotations

import dataclasses
import pickle

import pytest

from analyzer.timeline import records as r

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

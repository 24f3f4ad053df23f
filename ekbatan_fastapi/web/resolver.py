"""Constructor injection for job classes, with FastAPI's ``Depends`` semantics.

A job's ``__init__`` parameters are declared exactly as a route's would be:
``service: Annotated[ReportService, Depends(get_report_service)]`` (or the older
``service: ReportService = Depends(get_report_service)``). Providers may be plain or
``async`` functions, classes, or (async) generators whose code after ``yield`` runs at
shutdown, in reverse order. Providers may depend on other providers. Each provider runs once
per application (unless ``Depends(..., use_cache=False)``), and ``app.dependency_overrides``
replaces a provider exactly as it does for a route.

There is no request at startup, so a provider that asks for a ``Request`` cannot be used here.
"""

from __future__ import annotations

import contextlib
import inspect
import typing
from collections.abc import Mapping
from typing import Annotated, Any, TypeVar

from fastapi import params
from starlette.background import BackgroundTasks
from starlette.requests import HTTPConnection
from starlette.responses import Response
from starlette.websockets import WebSocket

from ..domain.errors import ConfigurationError

__all__ = ["DependencyResolver"]

T = TypeVar("T")

_REQUEST_ONLY = (HTTPConnection, WebSocket, Response, BackgroundTasks)


def _name(call: Any) -> str:
    return getattr(call, "__qualname__", None) or type(call).__qualname__


def _target(call: Any) -> Any:
    """What to inspect for the kind of provider: a callable object's ``__call__``."""
    if inspect.isroutine(call) or inspect.isclass(call):
        return call
    return getattr(call, "__call__", call)  # noqa: B004 - we want the bound method


def _hints(call: Any, owner: str) -> dict[str, Any]:
    """Resolved annotations (``Annotated`` kept); string annotations are evaluated here."""
    target = call.__init__ if inspect.isclass(call) else _target(call)
    try:
        return typing.get_type_hints(target, include_extras=True)
    except Exception as error:
        raise ConfigurationError(
            f"cannot read the parameter annotations of {owner}: {type(error).__name__}: "
            f"{error}; the names used in them must be importable from its module (define "
            "classes at module level, not inside a function)"
        ) from None


def _declared_dependency(param: inspect.Parameter, hint: Any) -> tuple[params.Depends, Any] | None:
    """The ``Depends`` marker of a parameter and the annotated type, if any."""
    annotated_type = hint
    marker: params.Depends | None = None
    if typing.get_origin(hint) is Annotated:
        annotated_type, *metadata = typing.get_args(hint)
        for item in metadata:
            if isinstance(item, params.Depends):
                marker = item
    if isinstance(param.default, params.Depends):
        marker = param.default
    return (marker, annotated_type) if marker is not None else None


class DependencyResolver:
    """Resolves providers for one application; teardowns are pushed onto ``stack``."""

    def __init__(
        self,
        stack: contextlib.AsyncExitStack,
        overrides: Mapping[Any, Any] | None = None,
        preset: Mapping[Any, Any] | None = None,
    ) -> None:
        self._stack = stack
        self._overrides = overrides if overrides is not None else {}
        self._cache: dict[Any, Any] = dict(preset or {})

    async def instantiate(self, cls: type[T]) -> T:
        """Construct ``cls`` with its declared dependencies."""
        owner = f"job class {cls.__module__}.{cls.__qualname__}"
        arguments = await self._arguments(cls, owner, chain=())
        return cls(**arguments)

    async def _arguments(self, call: Any, owner: str, chain: tuple[Any, ...]) -> dict[str, Any]:
        try:
            signature = inspect.signature(call)
        except (TypeError, ValueError) as error:
            raise ConfigurationError(f"cannot inspect {owner}: {error}") from None
        hints = _hints(call, owner)
        arguments: dict[str, Any] = {}
        for name, param in signature.parameters.items():
            if param.kind in (param.VAR_POSITIONAL, param.VAR_KEYWORD):
                continue
            hint = hints.get(name, param.annotation)
            declared = _declared_dependency(param, hint)
            if declared is None:
                if param.default is not param.empty:
                    continue
                raise ConfigurationError(_unresolvable(owner, name, hint))
            marker, annotated_type = declared
            provider = marker.dependency if marker.dependency is not None else annotated_type
            if not callable(provider):
                raise ConfigurationError(
                    f"parameter {name!r} of {owner} has Depends() without a provider and "
                    f"a type ({annotated_type!r}) that cannot be called; write "
                    "Depends(your_provider)"
                )
            try:
                arguments[name] = await self._provide(provider, marker.use_cache, chain)
            except ConfigurationError:
                raise
            except Exception as error:
                error.add_note(
                    f"while providing parameter {name!r} of {owner} with {_name(provider)}"
                )
                raise
        return arguments

    async def _provide(self, provider: Any, use_cache: bool, chain: tuple[Any, ...]) -> Any:
        call = self._overrides.get(provider, provider)
        key = _cache_key(call)
        if use_cache and key in self._cache:
            return self._cache[key]
        if key in chain:
            cycle = " -> ".join(_name(c) for c in (*chain[chain.index(key) :], call))
            raise ConfigurationError(f"dependency cycle: {cycle}; break it")
        owner = f"provider {_name(call)}"
        arguments = await self._arguments(call, owner, (*chain, key))
        target = _target(call)
        value: Any
        if inspect.isasyncgenfunction(target):
            manager = contextlib.asynccontextmanager(call)(**arguments)
            value = await self._stack.enter_async_context(manager)
        elif inspect.isgeneratorfunction(target):
            value = self._stack.enter_context(contextlib.contextmanager(call)(**arguments))
        else:
            value = call(**arguments)
            if inspect.isawaitable(value):
                value = await value
        if use_cache:
            self._cache[key] = value
        return value


def _cache_key(call: Any) -> Any:
    try:
        hash(call)
    except TypeError:
        return id(call)
    return call


def _unresolvable(owner: str, name: str, hint: Any) -> str:
    if hint is inspect.Parameter.empty:
        shown = "YourType"
    else:
        shown = getattr(hint, "__name__", None) or repr(hint)
    if inspect.isclass(hint) and issubclass(hint, _REQUEST_ONLY):
        return (
            f"parameter {name!r} of {owner} asks for a {shown}, which exists only during a "
            "request; jobs are built at startup, so depend on the resource itself instead"
        )
    return (
        f"cannot resolve parameter {name!r} of {owner}: declare its provider as "
        f"`{name}: Annotated[{shown}, Depends(provider)]`, give it a default, or pass a "
        "ready-made job instance in jobs=[...]"
    )

"""The model repository, shared memory, trace and log methods of the gRPC service: each a
conversion around the data plane's own (Triton's gRPC texts for what only gRPC can send: a
parameter of the wrong oneof kind)."""

import asyncio
from typing import Any, TypeAlias

import grpc
from tritonclient.grpc import service_pb2 as pb

from service.core import peer_uid
from service.core.dataplane import DataPlane
from service.errors import InvalidInput, Unsupported
from service.runtime.load_request import FILE_PREFIX

Context: TypeAlias = grpc.aio.ServicerContext
_LOAD_PARAMETER = "invalid value type for load parameter '{}', expected {}."


class Control:
    """Model control, shared memory, trace and log settings (a part of servicer.Servicer)."""

    plane: DataPlane

    async def RepositoryIndex(self, request: pb.RepositoryIndexRequest, context: Context) -> Any:
        if request.repository_name:  # Triton's gRPC refuses it (its HTTP ignores it)
            raise Unsupported("'repository_name' specification is not supported")
        entries = self.plane.repository_index(request.ready)
        return pb.RepositoryIndexResponse(models=[pb.RepositoryIndexResponse.ModelIndex(**entry)
                                                  for entry in entries])  # fmt: skip

    async def RepositoryModelLoad(self, request: pb.RepositoryModelLoadRequest,
                                  context: Context) -> Any:  # fmt: skip
        """Load with Triton's `config` (a JSON string) and `file:<version>/<name>` (bytes)."""
        config, files = None, {}
        for key, value in request.parameters.items():
            kind = value.WhichOneof("parameter_choice")
            if key == "config":
                if kind != "string_param":
                    raise InvalidInput(_LOAD_PARAMETER.format(key, "string_param"))
                config = value.string_param
            elif key.startswith(FILE_PREFIX):
                if kind != "bytes_param":
                    raise InvalidInput(_LOAD_PARAMETER.format(key[:100], "bytes_param"))
                files[key.removeprefix(FILE_PREFIX)] = value.bytes_param
            else:
                raise InvalidInput(f"Unrecognized load parameter '{key[:100]}'")
        # checked, and what it holds claimed, by the data plane (runtime/load_request.py)
        await self.plane.load(request.model_name, config, files, request.repository_name)
        return pb.RepositoryModelLoadResponse()

    async def RepositoryModelUnload(self, request: pb.RepositoryModelUnloadRequest,
                                    context: Context) -> Any:  # fmt: skip
        """Unload; `unload_dependents` (tritonclient always sends it) has no dependents here."""
        dependents = request.parameters.get("unload_dependents")
        if dependents is not None and dependents.WhichOneof("parameter_choice") != "bool_param":
            raise InvalidInput("invalid value type for 'unload_dependents' parameter, expected "
                               "bool_param.")  # fmt: skip
        await self.plane.unload(request.model_name, request.repository_name)
        return pb.RepositoryModelUnloadResponse()

    async def SystemSharedMemoryStatus(self, request: Any, context: Context) -> Any:
        regions = {r["name"]: pb.SystemSharedMemoryStatusResponse.RegionStatus(**r)
                   for r in self.plane.shm.status(request.name)}  # fmt: skip
        return pb.SystemSharedMemoryStatusResponse(regions=regions)

    async def SystemSharedMemoryRegister(self, request: Any, context: Context) -> Any:
        self.plane.shm.require_enabled()
        client = peer_uid.endpoint_of_grpc_peer(context.peer())
        uid = await asyncio.to_thread(peer_uid.uid_of, client)  # reads /proc: off the loop
        self.plane.shm.register(request.name, request.key, request.offset, request.byte_size,
                                client_uid=uid)  # fmt: skip
        return pb.SystemSharedMemoryRegisterResponse()

    async def SystemSharedMemoryUnregister(self, request: Any, context: Context) -> Any:
        self.plane.shm.unregister(request.name)
        return pb.SystemSharedMemoryUnregisterResponse()

    async def CudaSharedMemoryStatus(self, request: Any, context: Context) -> Any:
        self.plane.cuda_shm.status(request.name)  # none, or refused: there are no GPUs
        return pb.CudaSharedMemoryStatusResponse()

    async def CudaSharedMemoryRegister(self, request: Any, context: Context) -> Any:
        self.plane.cuda_shm.register(request.name)  # refused: there are no GPUs
        return pb.CudaSharedMemoryRegisterResponse()

    async def CudaSharedMemoryUnregister(self, request: Any, context: Context) -> Any:
        self.plane.cuda_shm.unregister(request.name)
        return pb.CudaSharedMemoryUnregisterResponse()

    async def TraceSetting(self, request: pb.TraceSettingRequest, context: Context) -> Any:
        """Triton's trace extension: the global settings or a model's, after the request's
        changes (a setting sent with no value is cleared; trace_level takes every value)."""
        model = request.model_name or None
        changes = {key: None if not value.value else (
            list(value.value) if key == "trace_level" else value.value[0])
            for key, value in request.settings.items()}  # fmt: skip
        tracing = self.plane.tracing
        found = tracing.update(model, changes) if changes else tracing.report(model)
        return pb.TraceSettingResponse(settings={
            key: pb.TraceSettingResponse.SettingValue(value=v if isinstance(v, list) else [v])
            for key, v in found.items()})  # fmt: skip

    async def LogSettings(self, request: pb.LogSettingsRequest, context: Context) -> Any:
        """Triton's logging extension: the settings after the request's changes (a setting
        sent with no value is left as it is)."""
        changes = {key: getattr(value, value.WhichOneof("parameter_choice"))
                   for key, value in request.settings.items()
                   if value.WhichOneof("parameter_choice")}  # fmt: skip
        settings = self.plane.logs.update(changes) if changes else self.plane.logs.report()
        return pb.LogSettingsResponse(settings={key: _log_value(value)
                                                for key, value in settings.items()})  # fmt: skip


def _log_value(value: Any) -> pb.LogSettingsResponse.SettingValue:
    if isinstance(value, bool):
        return pb.LogSettingsResponse.SettingValue(bool_param=value)
    if isinstance(value, int):
        return pb.LogSettingsResponse.SettingValue(uint32_param=value)
    return pb.LogSettingsResponse.SettingValue(string_param=value)

"""gcp-storage-emulator with GCS's object generations: python tests/gcs_emulator.py PORT

TensorStore (orbax's checkpoints) writes to GCS with generation preconditions, as
GCS documents them: an upload or delete with `ifGenerationMatch` fails with 412 unless
the object's generation is that one (0: no object), a read with
`ifGenerationNotMatch` of the current generation is 304, and every read says its
object's generation in `x-goog-generation`. The emulator keeps generations but
neither checks preconditions nor sends the header; this adds both to its handlers
and serves an in-memory bucket, test-bucket, on 127.0.0.1:PORT.
"""

import http.server
import sys
from http import HTTPStatus

from gcp_storage_emulator.exceptions import NotFound
from gcp_storage_emulator.handlers import objects


def generation(storage, bucket: str, name: str) -> int:
  try:
    return int(storage.get_file_obj(bucket, name)["generation"])
  except NotFound:
    return 0


def preconditions_hold(request, response, storage, name: str, *, read: bool) -> bool:
  current = generation(storage, request.params["bucket_name"], name)
  match = request.query.get("ifGenerationMatch")
  if match and int(match[0]) != current:
    response.status = HTTPStatus.PRECONDITION_FAILED
    return False
  not_match = request.query.get("ifGenerationNotMatch")
  if not_match and int(not_match[0]) == current:
    response.status = HTTPStatus.NOT_MODIFIED if read else HTTPStatus.PRECONDITION_FAILED
    return False
  return True


def with_preconditions(handler, object_name, *, read=False):
  def checked(request, response, storage, *args, **kwargs):
    name = object_name(request)
    if name is not None and not preconditions_hold(request, response, storage, name,
                                                   read=read):
      return None
    result = handler(request, response, storage, *args, **kwargs)
    if read and response.status in (HTTPStatus.OK, HTTPStatus.PARTIAL_CONTENT):
      response["x-goog-generation"] = str(
          generation(storage, request.params["bucket_name"], name))
    return result
  return checked


def object_id(request):
  return request.params.get("object_id")


def uploaded_name(request):
  if "name" in request.query:
    return request.query["name"][0]
  data = request.data if isinstance(request.data, dict) else {}
  return (data.get("meta") or {}).get("name")


# Routes are bound when the server module is imported: patch the handlers first.
objects.download = with_preconditions(objects.download, object_id, read=True)
objects.get = with_preconditions(objects.get, object_id, read=True)
objects.insert = with_preconditions(objects.insert, uploaded_name)
objects.delete = with_preconditions(objects.delete, object_id)

from gcp_storage_emulator.server import create_server  # noqa: E402

# Its one thread serves one request at a time, and socketserver's listen backlog is 5:
# TensorStore's and gcsfs's parallel requests overflowed it (74 listen overflows in one
# test, `nstat TcpExtListenOverflows`), each dropped connection waiting out TCP's 1 s
# retransmit. A longer queue: requests still served one at a time, in arrival order.
http.server.HTTPServer.request_queue_size = 1024

if __name__ == "__main__":
  create_server("127.0.0.1", int(sys.argv[1]), in_memory=True,
                default_bucket="test-bucket").run()

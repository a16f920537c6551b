"""ACL request signing (remoting): credentials, the signature, and its verification; and what
an ACL 2.0 broker checks for each request (:func:`request_needs`), for errors that name it.

ACL 2.0 (RocketMQ 5.3+, the only ACL of 5.3.3+) verifies the very signature ACL 1.0 defined
(5.5.0's ``DefaultAuthenticationContextBuilder`` builds the signed content with
``AclUtils.combineRequestContent`` over the sorted extFields but ``Signature``), against the
user's password: the access key is the user name, the secret key its password.

The rule, checked against apache/rocketmq (facts only, our own code):

- ``acl/common/AclClientRPCHook.java`` (5.x, and 4.9.x from the change that replaced the
  reflection over the request header): ``doBeforeRequest`` first adds extFields ``AccessKey``
  and, when set, ``SecurityToken``; ``parseRequestContent`` then calls
  ``makeCustomHeaderToNet()`` and takes *all* extFields in a ``TreeMap`` (sorted by key), so
  the header fields (which travel as extFields) are signed together with anything added by
  ``addExtField``. The signature is added last as extField ``Signature``.
- Older 4.x hooks built the sorted map from ``AccessKey``/``SecurityToken`` plus the custom
  header's non-null declared fields (name -> ``toString()``). Those names and values are
  exactly the extFields ``makeCustomHeaderToNet`` writes, so for requests whose extFields are
  all header fields (every request this client sends but QUERY_MESSAGE) both versions sign the
  same bytes.
- ``acl/common/AclUtils.java`` ``combineRequestContent``: the values (not the keys) of the
  sorted map, ``Signature`` skipped, concatenated, encoded UTF-8, followed by the body bytes
  (none when the body is null). ``calSignature`` -> ``AclSigner.java``: HmacSHA1 keyed with the
  secret key's UTF-8 bytes, Base64 (standard alphabet, padded, no line breaks).
- ``acl/plain/PlainAccessResource.java`` ``parse`` (broker side): recomputes over every
  received extField except ``Signature``, and except ``_UNIQUE_KEY_QUERY``
  (MixAll.UNIQUE_MSG_QUERY_FLAG, no header field) from clients of 4.9.3 and before (request
  version <= 399, the older hooks above); ACL 2.0's DefaultAuthenticationContextBuilder the same.
- ``acl/common/SessionCredentials.java``: the extField names ``AccessKey``, ``SecretKey`` (never
  sent), ``Signature``, ``SecurityToken``; charset UTF-8.

Java's ``TreeMap<String, ...>`` orders keys by UTF-16 code unit, Python's ``sorted`` by code
point; they agree except for keys mixing astral and U+E000..U+FFFF characters (header keys are
ASCII).
"""

from __future__ import annotations

import base64
import hashlib
import hmac
import json
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field

from .frame import RemotingCommand

__all__ = [
    "ACCESS_KEY",
    "grpc_needs",
    "request_needs",
    "SECURITY_TOKEN",
    "SIGNATURE",
    "Credentials",
    "calc_signature",
    "grpc_auth_metadata",
    "sign_request",
    "signing_content",
    "verify_grpc_metadata",
    "verify_request",
]

ACCESS_KEY = "AccessKey"
SIGNATURE = "Signature"
SECURITY_TOKEN = "SecurityToken"
#: Left out of the content by the broker when an old client sent it (Java's MixAll.UNIQUE_MSG_QUERY_FLAG).
_UNIQUE_KEY_QUERY = "_UNIQUE_KEY_QUERY"
#: MQVersion.Version.V4_9_3's ordinal: requests of this version and before are signed without
#: _UNIQUE_KEY_QUERY
_V4_9_3 = 399
_MASK = "***"


@dataclass(frozen=True)
class Credentials:
    """An ACL 1.0 access key, its secret key and an optional security token.

    ``repr``/``str`` never show the secret key or the token."""

    access_key: str
    secret_key: str = field(repr=False)
    security_token: str | None = field(default=None, repr=False)

    def __post_init__(self) -> None:
        if not self.access_key or not self.secret_key:
            # never echo the secret: say which part is missing
            missing = [n for n, v in (("access key", self.access_key), ("secret key", self.secret_key)) if not v]
            raise ValueError(f"credentials need both an access key and a secret key; missing: {', '.join(missing)}")

    def __repr__(self) -> str:
        token = ", security_token='***'" if self.security_token else ""
        return f"Credentials(access_key={self.access_key!r}, secret_key='{_MASK}'{token})"

    __str__ = __repr__


def signing_content(ext_fields: Mapping[str, str], body: bytes | None,
                    exclude: Iterable[str] = (SIGNATURE,)) -> bytes:
    """The bytes that are signed: extField values sorted by key (``exclude`` left out),
    concatenated and UTF-8 encoded, then the body."""
    skip = set(exclude)
    text = "".join(str(ext_fields[k]) for k in sorted(ext_fields) if k not in skip)
    return text.encode("utf-8") + (body or b"")


def calc_signature(content: bytes, secret_key: str) -> str:
    """Base64(HMAC-SHA1(secret_key UTF-8, content))."""
    digest = hmac.new(secret_key.encode("utf-8"), content, hashlib.sha1).digest()
    return base64.b64encode(digest).decode("ascii")


def sign_request(cmd: RemotingCommand, creds: Credentials) -> None:
    """Add ``AccessKey`` (and ``SecurityToken``) and ``Signature`` to ``cmd``'s extFields.

    The extFields dict is replaced, not mutated: callers often reuse their dict for retries."""
    ext = dict(cmd.ext_fields)
    ext.pop(SIGNATURE, None)
    ext[ACCESS_KEY] = creds.access_key
    if creds.security_token:
        ext[SECURITY_TOKEN] = creds.security_token
    ext[SIGNATURE] = calc_signature(signing_content(ext, cmd.body), creds.secret_key)
    cmd.ext_fields = ext


def verify_request(cmd: RemotingCommand, secrets: Mapping[str, str]) -> str | None:
    """None when ``cmd`` carries a valid signature by a key of ``secrets`` (access key ->
    secret key), else why not (never containing a secret)."""
    ext = cmd.ext_fields
    ak = ext.get(ACCESS_KEY)
    sig = ext.get(SIGNATURE)
    if not ak or not sig:
        missing = [n for n, v in ((ACCESS_KEY, ak), (SIGNATURE, sig)) if not v]
        return (f"request code {cmd.code} is not signed (missing extFields {', '.join(missing)}); this broker "
                f"has ACL on: configure an access key and secret key")
    secret = secrets.get(ak)
    if secret is None:
        return f"request code {cmd.code}: AccessKey {ak!r} is unknown to this broker"
    unsigned = (SIGNATURE, _UNIQUE_KEY_QUERY) if cmd.version <= _V4_9_3 else (SIGNATURE,)
    expected = calc_signature(signing_content(ext, cmd.body, unsigned), secret)
    if not hmac.compare_digest(expected.encode("ascii"), sig.encode("utf-8", "replace")):
        return f"request code {cmd.code}: signature mismatch for AccessKey {ak!r} (wrong secret key?)"
    return None


# -- what an ACL 2.0 broker checks --------------------------------------------------------
# Read from 5.5.0's org.apache.rocketmq.auth DefaultAuthorizationContextBuilder (its switch over
# request codes, then the @RocketMQAction/@RocketMQResource annotations of the request headers):
# each request is checked once per resource, and passes when a policy allows any of the listed
# actions. A retry topic (%RETRY%G) is checked as its group G. Requests with no resource (a
# producer's heartbeat, END_TRANSACTION without a topic) are not checked.

_RETRY = "%RETRY%"
_SUB, _PUB, _GET = ("Sub",), ("Pub",), ("Get",)
#: request code -> (resource type, extField, actions) per resource it names
_NEEDS: dict[int, tuple[tuple[str, str, tuple[str, ...]], ...]] = {
    10: (("Topic", "topic", _PUB),),  # SEND_MESSAGE
    310: (("Topic", "b", _PUB),),  # SEND_MESSAGE_V2
    320: (("Topic", "b", _PUB),),  # SEND_BATCH_MESSAGE
    37: (("Topic", "topic", _PUB),),  # END_TRANSACTION (only when it names a topic)
    36: (("Group", "group", _SUB),),  # CONSUMER_SEND_MSG_BACK
    11: (("Topic", "topic", _SUB), ("Group", "consumerGroup", _SUB)),  # PULL_MESSAGE
    361: (("Topic", "topic", _SUB), ("Group", "consumerGroup", _SUB)),  # LITE_PULL_MESSAGE
    35: (("Group", "consumerGroup", _SUB),),  # UNREGISTER_CLIENT
    38: (("Group", "consumerGroup", ("Sub", "Get")),),  # GET_CONSUMER_LIST_BY_GROUP
    14: (("Topic", "topic", ("Sub", "Get")), ("Group", "consumerGroup", ("Sub", "Get"))),  # QUERY_CONSUMER_OFFSET
    15: (("Topic", "topic", ("Sub", "Update")), ("Group", "consumerGroup", ("Sub", "Update"))),  # UPDATE_...OFFSET
    105: (("Topic", "topic", ("Pub", "Sub", "Get")),),  # GET_ROUTEINFO_BY_TOPIC (a proxy; name servers check none)
    30: (("Topic", "topic", _GET),),  # GET_MAX_OFFSET
    31: (("Topic", "topic", _GET),),  # GET_MIN_OFFSET
    29: (("Topic", "topic", _GET),),  # SEARCH_OFFSET_BY_TIMESTAMP
    32: (("Topic", "topic", _GET),),  # GET_EARLIEST_MSG_STORETIME
    202: (("Topic", "topic", _GET),),  # GET_TOPIC_STATS_INFO
    321: (("Topic", "topic", _GET),),  # QUERY_CONSUME_QUEUE (Get on its consumerGroup too: never sent)
    12: (("Topic", "topic", ("Sub", "Get")),),  # QUERY_MESSAGE (mqadmin queryMsgByKey, queryMsgTraceById)
    17: (("Topic", "topic", ("Create",)),),  # UPDATE_AND_CREATE_TOPIC
    222: (("Group", "group", ("Update",)), ("Topic", "topic", ("Update",))),  # INVOKE_BROKER_TO_RESET_OFFSET
    307: (("Group", "consumerGroup", _GET),),  # GET_CONSUMER_RUNNING_INFO
    203: (("Group", "consumerGroup", _GET),),  # GET_CONSUMER_CONNECTION_LIST
}
_HEART_BEAT = 34


def request_needs(code: int, ext_fields: Mapping[str, str] | None = None,
                  body: bytes | None = None) -> list[tuple[str, tuple[str, ...]]]:
    """What an ACL 2.0 broker checks for a request: (resource key such as ``Topic:T`` or
    ``Group:G``, the actions any of which it accepts), per resource; [] for requests it does not
    check by resource (or that this client does not send). A resource whose field ``ext_fields``
    lacks comes as its type alone (``Group:``): the caller did not say which."""
    ext = ext_fields or {}
    out: list[tuple[str, tuple[str, ...]]] = []
    if code == _HEART_BEAT:  # every consumer group of the body, and the topics each subscribes
        try:
            data = json.loads(body or b"{}")
        except ValueError:
            return out
        for consumer in data.get("consumerDataSet") or () if isinstance(data, dict) else ():
            out.append((f"Group:{consumer.get('groupName', '')}", _SUB))
            out.extend((f"Topic:{sub.get('topic', '')}", _SUB) for sub in consumer.get("subscriptionDataSet") or ()
                       if not str(sub.get("topic", "")).startswith(_RETRY))
        return out
    for kind, key, actions in _NEEDS.get(code, ()):
        name = ext.get(key) or ""
        if name.startswith(_RETRY):  # the broker checks a retry topic as its group, for Sub
            out.append((f"Group:{name[len(_RETRY):]}", _SUB))
        else:
            out.append((f"{kind}:{name}", actions))
    return list(dict.fromkeys(out))


# What a 5.x proxy with ACL 2.0 checks for a gRPC call, read from 5.5.0's
# DefaultAuthorizationContextBuilder.build(Metadata, GeneratedMessageV3): a send, a recall and an
# EndTransaction need Pub on their topic; QueryRoute Pub or Sub on its topic; ReceiveMessage,
# AckMessage, ForwardMessageToDeadLetterQueue and QueryAssignment Sub on the group and the topic;
# a consumer's Heartbeat, ChangeInvisibleDuration and NotifyClientTermination (when it names a
# group) Sub on the group; Telemetry's settings Pub on each published topic, Sub on the group and
# each subscribed topic. Released proxies do not serve PullMessage, QueryOffset, GetOffset or
# UpdateOffset: for them the actions are those of the remoting requests that do the same
# (PULL_MESSAGE, GET_MAX_OFFSET, QUERY_CONSUMER_OFFSET, UPDATE_CONSUMER_OFFSET).

_PUB_OR_SUB = ("Pub", "Sub")
_CONSUMER_TYPES = (2, 3, 4)  # apache.rocketmq.v2.ClientType PUSH_CONSUMER, SIMPLE_CONSUMER, PULL_CONSUMER


def _name(resource: object) -> str:
    return str(getattr(resource, "name", "") or "")


def grpc_needs(rpc: str, request: object) -> list[tuple[str, tuple[str, ...]]]:
    """What a 5.x proxy with ACL 2.0 checks for the gRPC call ``rpc`` (the method name, e.g.
    ``SendMessage``) carrying ``request`` (its protobuf message): (resource key, the actions any
    of which it accepts) per resource, as :func:`request_needs` gives them for remoting; [] for a
    call the proxy checks by no resource."""
    topic = _name(getattr(request, "topic", None))
    group = _name(getattr(request, "group", None))
    mq_topic = _name(getattr(getattr(request, "message_queue", None), "topic", None))
    out: list[tuple[str, tuple[str, ...]]] = []
    if rpc == "SendMessage":
        messages = getattr(request, "messages", ())
        if messages:
            out.append((f"Topic:{_name(messages[0].topic)}", _PUB))
    elif rpc in ("EndTransaction", "RecallMessage"):
        out.append((f"Topic:{topic}", _PUB))
    elif rpc == "QueryRoute":
        out.append((f"Topic:{topic}", _PUB_OR_SUB))
    elif rpc in ("AckMessage", "ForwardMessageToDeadLetterQueue", "QueryAssignment"):
        out += [(f"Group:{group}", _SUB), (f"Topic:{topic}", _SUB)]
    elif rpc in ("ReceiveMessage", "PullMessage"):
        out += [(f"Group:{group}", _SUB), (f"Topic:{mq_topic}", _SUB)]
    elif rpc == "Heartbeat":
        if getattr(request, "client_type", 0) in _CONSUMER_TYPES:
            out.append((f"Group:{group}", _SUB))
    elif rpc in ("ChangeInvisibleDuration", "NotifyClientTermination"):
        if group:
            out.append((f"Group:{group}", _SUB))
    elif rpc == "Telemetry":
        settings = getattr(request, "settings", None)
        out += [(f"Topic:{_name(t)}", _PUB) for t in getattr(getattr(settings, "publishing", None), "topics", ())]
        subscription = getattr(settings, "subscription", None)
        if subscription is not None and _name(getattr(subscription, "group", None)):
            out.append((f"Group:{_name(subscription.group)}", _SUB))
            out += [(f"Topic:{_name(e.topic)}", _SUB) for e in getattr(subscription, "subscriptions", ())]
    elif rpc == "QueryOffset":
        out.append((f"Topic:{mq_topic}", _GET))
    elif rpc == "GetOffset":
        out += [(f"Topic:{mq_topic}", ("Sub", "Get")), (f"Group:{group}", ("Sub", "Get"))]
    elif rpc == "UpdateOffset":
        out += [(f"Topic:{mq_topic}", ("Sub", "Update")), (f"Group:{group}", ("Sub", "Update"))]
    return list(dict.fromkeys(out))


# -- RocketMQ 5 gRPC (apache.rocketmq.v2) ------------------------------------------------
# Checked against apache/rocketmq-clients (java Signature.java; the Rust, C++ and C# clients):
# metadata x-mq-date-time = UTC ``yyyyMMdd'T'HHmmss'Z'``; authorization =
# ``MQv2-HMAC-SHA1 Credential=<ak>, SignedHeaders=x-mq-date-time, Signature=<hex>`` where hex is
# HMAC-SHA1(secret key, the date-time text) (Java/Python/Rust lower case, C#/C++ upper case;
# some clients write ``Credential=<ak>/<region>/Rocketmq``); the token goes in x-mq-session-token.

GRPC_DATE_TIME = "x-mq-date-time"
GRPC_AUTHORIZATION = "authorization"
GRPC_SESSION_TOKEN = "x-mq-session-token"
GRPC_ALGORITHM = "MQv2-HMAC-SHA1"


def grpc_auth_metadata(creds: Credentials, date_time: str) -> list[tuple[str, str]]:
    """The authorization (and session token) metadata for a call carrying ``date_time``."""
    sig = hmac.new(creds.secret_key.encode("utf-8"), date_time.encode("utf-8"), hashlib.sha1).hexdigest()
    out = [(GRPC_AUTHORIZATION,
            f"{GRPC_ALGORITHM} Credential={creds.access_key}, SignedHeaders={GRPC_DATE_TIME}, Signature={sig}")]
    if creds.security_token:
        out.append((GRPC_SESSION_TOKEN, creds.security_token))
    return out


def verify_grpc_metadata(metadata: Mapping[str, str], secrets: Mapping[str, str]) -> str | None:
    """None when the call's metadata is signed by a key of ``secrets``, else why not."""
    auth = metadata.get(GRPC_AUTHORIZATION, "")
    date_time = metadata.get(GRPC_DATE_TIME, "")
    if not auth or not date_time:
        return f"the call is not signed (needs {GRPC_AUTHORIZATION} and {GRPC_DATE_TIME} metadata); ACL is on"
    algo, _, rest = auth.partition(" ")
    parts = {k.strip(): v.strip() for k, _, v in (p.partition("=") for p in rest.split(","))}
    ak = parts.get("Credential", "").split("/", 1)[0]
    sig = parts.get("Signature", "")
    if algo != GRPC_ALGORITHM or not ak or not sig:
        return f"authorization is not '{GRPC_ALGORITHM} Credential=..., SignedHeaders=..., Signature=...'"
    secret = secrets.get(ak)
    if secret is None:
        return f"AccessKey {ak!r} is unknown to this broker"
    expected = hmac.new(secret.encode("utf-8"), date_time.encode("utf-8"), hashlib.sha1).hexdigest()
    if not hmac.compare_digest(expected, sig.lower()):
        return f"signature mismatch for AccessKey {ak!r} (wrong secret key?)"
    return None

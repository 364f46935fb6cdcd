"""Creates a blob container on Azurite (or any Azure Blob endpoint) with
Shared Key authorization, from the standard library only.

Usage: azurite-container.py ACCOUNT_URL CONTAINER
ACCOUNT_URL is path-style, as Azurite serves it: http://HOST:PORT/ACCOUNT.
The account name and key come from AZURE_STORAGE_ACCOUNT_NAME and
AZURE_STORAGE_ACCOUNT_KEY, never from the command line. An existing
container is fine (409 ContainerAlreadyExists).
"""

import base64
import hashlib
import hmac
import os
import sys
import urllib.error
import urllib.parse
import urllib.request
from email.utils import formatdate

VERSION = "2021-08-06"


def main() -> int:
    account_url, container = sys.argv[1], sys.argv[2]
    account = os.environ["AZURE_STORAGE_ACCOUNT_NAME"]
    key = base64.b64decode(os.environ["AZURE_STORAGE_ACCOUNT_KEY"])
    url = f"{account_url.rstrip('/')}/{container}?restype=container"
    path = urllib.parse.urlparse(url).path
    date = formatdate(usegmt=True)
    headers = {"x-ms-date": date, "x-ms-version": VERSION}
    canonical_headers = "".join(f"{k}:{v}\n" for k, v in sorted(headers.items()))
    # Path-style: the resource is /ACCOUNT followed by the URL's path
    # (which starts with the account again).
    resource = f"/{account}{path}\nrestype:container"
    # urllib sends a Content-Type with any body: name one, and sign it.
    content_type = "application/octet-stream"
    # VERB, Content-Encoding, -Language, -Length (empty for 0), -MD5,
    # -Type, Date, If-Modified-Since, If-Match, If-None-Match,
    # If-Unmodified-Since, Range.
    fields = ["PUT", "", "", "", "", content_type, "", "", "", "", "", ""]
    to_sign = "\n".join(fields) + "\n" + canonical_headers + resource
    signature = base64.b64encode(
        hmac.new(key, to_sign.encode(), hashlib.sha256).digest()
    ).decode()
    headers["Authorization"] = f"SharedKey {account}:{signature}"
    headers["Content-Length"] = "0"
    headers["Content-Type"] = content_type
    request = urllib.request.Request(url, data=b"", method="PUT", headers=headers)
    try:
        with urllib.request.urlopen(request, timeout=10):
            return 0
    except urllib.error.HTTPError as e:
        if e.code == 409:
            return 0
        print(f"creating container {container}: HTTP {e.code}: {e.read()[:500]!r}", file=sys.stderr)
        return 1


if __name__ == "__main__":
    sys.exit(main())

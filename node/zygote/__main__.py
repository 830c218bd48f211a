"""`python -m node.zygote SOCKET [--parent PID] [--preload a,b,...]`: the zygote
(node/zygote/server.py). In a forked child `main` returns its request and the child runs it
here, so its module runs with none of the zygote's frames on the stack and the interpreter
ends it as it would end `python -m MODULE`."""

import os
import sys

from node.zygote import child, server

request = server.main(sys.argv[1:])
if request is None:
    os._exit(0)  # the zygote itself: no teardown of what it preloaded (1-2 CPU-s)
child.run(request)

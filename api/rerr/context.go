package rerr

import "context"

// errContextCanceled is context.Canceled, named here so status mapping keeps it recognisable.
var errContextCanceled = context.Canceled

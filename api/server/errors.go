package server

import "carehub/processors/fault"

var (
	notFound         = fault.New(fault.KindNotFound, "no such route")
	methodNotAllowed = fault.New(fault.KindInvalid, "method not allowed on this route")
)

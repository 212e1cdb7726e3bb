package server

import "carehub/processors/fault"

var notFound = fault.New(fault.KindNotFound, "no such route")

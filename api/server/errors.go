package server

import "carehub/kernel/fault"

var notFound = fault.New(fault.KindNotFound, "no such route")

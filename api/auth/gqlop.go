package auth

import (
	"context"

	"carehub/api/graphql/gqldoc"
)

// unparsedOperation names a GraphQL call whose document could not be read (the call is recorded
// all the same; the GraphQL handler answers it with its own error).
const unparsedOperation = gqldoc.Unparsed

// maxOperationLen bounds the operation string of an audit record.
const maxOperationLen = gqldoc.MaxOperationLen

// GraphQLOperation names a GraphQL request for the audit log: "graphql <type> <root fields>",
// the operation type (query, mutation, subscription) and the distinct root field names, sorted
// and comma-joined, aliases resolved and fragments at the root expanded: "graphql query patient",
// "graphql mutation runAgent", "graphql query organizations,patients". operationName selects
// among several operations as GraphQL does. A document that does not parse, or whose operation
// cannot be chosen, is "graphql unparsed". Validating the document is the GraphQL handler's job.
//
// It parses query with gqldoc.Parse, the parse the GraphQL handler runs on, which remembers the
// short documents parsed last; the handler itself names the calls it parses from its own parse
// (SetGraphQLOperation), so that Auditor.Middleware reads their body for nothing.
func GraphQLOperation(query, operationName string) string {
	doc, err := gqldoc.Parse(query)
	if err != nil {
		return unparsedOperation
	}
	return gqldoc.OperationName(doc, operationName)
}

// SetGraphQLOperation names the GraphQL call whose request context is ctx for its audit record:
// op is the name gqldoc.OperationName gave the operation, from the document the GraphQL handler
// parsed to run it. Auditor.Middleware then records op rather than naming the call from the
// request body itself, which it does only for calls nobody named (a replayed idempotent
// mutation, a body the handler could not decode, a document it refused before parsing it).
// Outside Auditor.Middleware, for a call it does not name (not a live caller's POST to the
// GraphQL endpoint), or once the call is named, it does nothing.
func SetGraphQLOperation(ctx context.Context, op string) {
	st := auditStateFrom(ctx)
	if st == nil {
		return
	}
	st.mu.Lock()
	if st.graphqlBodyPending {
		st.graphqlOp, st.graphqlBody, st.graphqlBodyPending = op, nil, false
	}
	st.mu.Unlock()
}

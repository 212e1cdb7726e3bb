package ws

import (
	"context"

	graphql "github.com/graph-gophers/graphql-go"
)

// ResponsesFrom adapts the channel of (*graphql.Schema).Subscribe, which also runs queries and
// mutations, to a channel of Responses (for Chan); items of other types are skipped. Once ctx ends
// it discards what src still yields and closes the result when src closes, so that a closed
// result means graph-gophers' goroutines for the operation are done. It owns one goroutine,
// which ends with the result channel.
func ResponsesFrom(ctx context.Context, src <-chan any) <-chan *Response {
	out := make(chan *Response)
	go func() {
		defer close(out)
		defer func() {
			for range src {
			}
		}()
		for {
			var v any
			select {
			case <-ctx.Done():
				return
			case item, ok := <-src:
				if !ok {
					return
				}
				v = item
			}
			var r *Response
			switch item := v.(type) {
			case *graphql.Response:
				r = &Response{Data: item.Data, Errors: item.Errors, Extensions: item.Extensions}
			case *Response:
				r = item
			default:
				continue
			}
			select {
			case out <- r:
			case <-ctx.Done():
				return
			}
		}
	}()
	return out
}

package server_test

import (
	"context"
	"fmt"

	"github.com/openai/openai-go/v3"
	"github.com/openai/openai-go/v3/option"
)

// The README's SDK example (compiled, not run: it needs a running server).
func Example_openAISDK() {
	ctx := context.Background()
	client := openai.NewClient(option.WithBaseURL("http://127.0.0.1:8080/v1/"), option.WithAPIKey("unused"))
	resp, err := client.Chat.Completions.New(ctx, openai.ChatCompletionNewParams{
		Model:    "model", // the file name without .cmf, or --name
		Messages: []openai.ChatCompletionMessageParamUnion{openai.UserMessage("Why is the sky blue?")},
	})
	if err != nil {
		fmt.Println(err)
		return
	}
	fmt.Println(resp.Choices[0].Message.Content)
}

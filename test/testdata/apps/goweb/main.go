// goweb is the sample Go web app kpush's end-to-end tests push.
package main

import (
	"fmt"
	"log"
	"net/http"
	"os"
)

const greeting = "hello from goweb v1"

func main() {
	http.HandleFunc("/", func(w http.ResponseWriter, r *http.Request) {
		fmt.Fprintln(w, greeting)
	})
	log.Printf("listening on :%s", os.Getenv("PORT"))
	log.Fatal(http.ListenAndServe(":"+os.Getenv("PORT"), nil))
}

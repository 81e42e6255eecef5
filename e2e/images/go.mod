module splice.dev/e2e/images

go 1.26.0

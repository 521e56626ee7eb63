import com.fasterxml.jackson.databind.JsonNode;
import com.fasterxml.jackson.databind.ObjectMapper;
import com.fasterxml.jackson.databind.node.ObjectNode;
import io.cloudevents.CloudEvent;
import io.cloudevents.CloudEventData;
import io.cloudevents.core.builder.CloudEventBuilder;
import io.cloudevents.core.message.Encoding;
import io.cloudevents.jackson.JsonFormat;
import io.cloudevents.kafka.CloudEventDeserializer;
import io.cloudevents.kafka.CloudEventSerializer;
import io.cloudevents.kafka.KafkaMessageFactory;
import java.io.BufferedReader;
import java.io.InputStreamReader;
import java.net.URI;
import java.nio.charset.StandardCharsets;
import java.time.Duration;
import java.time.OffsetDateTime;
import java.time.format.DateTimeFormatter;
import java.util.ArrayList;
import java.util.Base64;
import java.util.Iterator;
import java.util.List;
import java.util.Map;
import java.util.Properties;
import org.apache.kafka.clients.consumer.ConsumerRecord;
import org.apache.kafka.clients.consumer.KafkaConsumer;
import org.apache.kafka.clients.producer.KafkaProducer;
import org.apache.kafka.clients.producer.ProducerRecord;
import org.apache.kafka.common.PartitionInfo;
import org.apache.kafka.common.TopicPartition;
import org.apache.kafka.common.serialization.ByteArrayDeserializer;
import org.apache.kafka.common.serialization.ByteArraySerializer;

/**
 * The official CloudEvents Java SDK on both ends of outboxkit, for tests/interop.
 *
 * <p>{@code produce BOOTSTRAP TOPIC}: reads one event per stdin line (JSON: mode "binary" or
 * "structured", key, attributes, typed extensions, data_base64) and publishes it with the SDK's
 * {@code CloudEventSerializer} in that mode. {@code consume BOOTSTRAP TOPIC COUNT TIMEOUT_S}:
 * reads the topic from the beginning with the SDK's {@code CloudEventDeserializer} and prints
 * each event as one JSON line: every attribute and extension with its Java type, the data as
 * base64, and the record's key, partition and offset.
 */
public final class CloudEventsInterop {
  private static final ObjectMapper JSON = new ObjectMapper();
  private static final String[] ATTRIBUTES = {
    "specversion", "id", "source", "type", "datacontenttype", "dataschema", "subject", "time"
  };

  public static void main(String[] args) throws Exception {
    if (args.length >= 2 && args[0].equals("produce")) {
      produce(args[1], args[2]);
    } else if (args.length >= 5 && args[0].equals("consume")) {
      consume(args[1], args[2], Integer.parseInt(args[3]), Integer.parseInt(args[4]));
    } else {
      System.err.println("usage: produce BOOTSTRAP TOPIC | consume BOOTSTRAP TOPIC COUNT TIMEOUT_S");
      System.exit(2);
    }
  }

  private static void produce(String bootstrap, String topic) throws Exception {
    BufferedReader in = new BufferedReader(new InputStreamReader(System.in, StandardCharsets.UTF_8));
    try (KafkaProducer<byte[], CloudEvent> binary = producer(bootstrap, Encoding.BINARY);
        KafkaProducer<byte[], CloudEvent> structured = producer(bootstrap, Encoding.STRUCTURED)) {
      int sent = 0;
      for (String line = in.readLine(); line != null; line = in.readLine()) {
        if (line.isBlank()) {
          continue;
        }
        JsonNode spec = JSON.readTree(line);
        KafkaProducer<byte[], CloudEvent> producer =
            spec.get("mode").asText().equals("structured") ? structured : binary;
        byte[] key = spec.hasNonNull("key") ? Base64.getDecoder().decode(spec.get("key").asText()) : null;
        producer.send(new ProducerRecord<>(topic, key, build(spec))).get();
        sent++;
      }
      System.out.println("{\"sent\":" + sent + "}");
    }
  }

  private static KafkaProducer<byte[], CloudEvent> producer(String bootstrap, Encoding encoding) {
    Properties props = new Properties();
    props.put("bootstrap.servers", bootstrap);
    props.put("acks", "all");
    props.put("key.serializer", ByteArraySerializer.class.getName());
    props.put("value.serializer", CloudEventSerializer.class.getName());
    props.put(CloudEventSerializer.ENCODING_CONFIG, encoding);
    props.put(CloudEventSerializer.EVENT_FORMAT_CONFIG, JsonFormat.CONTENT_TYPE);
    return new KafkaProducer<>(props);
  }

  private static CloudEvent build(JsonNode spec) {
    JsonNode a = spec.get("attributes");
    CloudEventBuilder builder =
        CloudEventBuilder.v1()
            .withId(a.get("id").asText())
            .withSource(URI.create(a.get("source").asText()))
            .withType(a.get("type").asText());
    if (a.hasNonNull("subject")) {
      builder.withSubject(a.get("subject").asText());
    }
    if (a.hasNonNull("dataschema")) {
      builder.withDataSchema(URI.create(a.get("dataschema").asText()));
    }
    if (a.hasNonNull("time")) {
      builder.withTime(OffsetDateTime.parse(a.get("time").asText()));
    }
    if (a.hasNonNull("datacontenttype")) {
      builder.withDataContentType(a.get("datacontenttype").asText());
    }
    Iterator<Map.Entry<String, JsonNode>> extensions = spec.get("extensions").fields();
    while (extensions.hasNext()) {
      Map.Entry<String, JsonNode> extension = extensions.next();
      String name = extension.getKey();
      String type = extension.getValue().get("type").asText();
      String value = extension.getValue().get("value").asText();
      switch (type) {
        case "Integer" -> builder.withExtension(name, Integer.valueOf(value));
        case "Boolean" -> builder.withExtension(name, Boolean.valueOf(value));
        case "URI" -> builder.withExtension(name, URI.create(value));
        case "Timestamp" -> builder.withExtension(name, OffsetDateTime.parse(value));
        case "Binary" -> builder.withExtension(name, Base64.getDecoder().decode(value));
        default -> builder.withExtension(name, value);
      }
    }
    if (spec.hasNonNull("data_base64")) {
      builder.withData(Base64.getDecoder().decode(spec.get("data_base64").asText()));
    }
    return builder.build();
  }

  private static void consume(String bootstrap, String topic, int count, int timeoutS)
      throws Exception {
    Properties props = new Properties();
    props.put("bootstrap.servers", bootstrap);
    props.put("enable.auto.commit", "false");
    props.put("key.deserializer", ByteArrayDeserializer.class.getName());
    props.put("value.deserializer", CloudEventDeserializer.class.getName());
    try (KafkaConsumer<byte[], CloudEvent> consumer = new KafkaConsumer<>(props)) {
      List<TopicPartition> partitions = new ArrayList<>();
      for (PartitionInfo info : consumer.partitionsFor(topic, Duration.ofSeconds(timeoutS))) {
        partitions.add(new TopicPartition(topic, info.partition()));
      }
      consumer.assign(partitions);
      consumer.seekToBeginning(partitions);
      long deadline = System.nanoTime() + Duration.ofSeconds(timeoutS).toNanos();
      int seen = 0;
      while (seen < count && System.nanoTime() < deadline) {
        for (ConsumerRecord<byte[], CloudEvent> record : consumer.poll(Duration.ofMillis(200))) {
          System.out.println(JSON.writeValueAsString(describe(record)));
          seen++;
        }
      }
      System.out.flush();
    }
  }

  private static ObjectNode describe(ConsumerRecord<byte[], CloudEvent> record) {
    ObjectNode line = JSON.createObjectNode();
    line.put("partition", record.partition());
    line.put("offset", record.offset());
    line.put("key", record.key() == null ? null : Base64.getEncoder().encodeToString(record.key()));
    CloudEvent event = record.value();
    line.put("reader", "CloudEventDeserializer");
    if (event == null) {
      // Kafka clients never call a value deserializer for a null value, so an event without
      // data (binding 3.2.2: a null value) reaches the application as null: read it with the
      // SDK's reader, which the deserializer wraps.
      event = KafkaMessageFactory.createReader(record.headers(), null).toEvent();
      line.put("reader", "KafkaMessageFactory");
    }
    ObjectNode attributes = line.putObject("attributes");
    for (String name : ATTRIBUTES) {
      Object value = event.getAttribute(name);
      if (value != null) {
        attributes.put(name, text(value));
      }
    }
    ObjectNode extensions = line.putObject("extensions");
    for (String name : event.getExtensionNames()) {
      Object value = event.getExtension(name);
      ObjectNode typed = extensions.putObject(name);
      typed.put("type", typeName(value));
      typed.put("value", text(value));
    }
    CloudEventData data = event.getData();
    line.put("data_base64", data == null ? null : Base64.getEncoder().encodeToString(data.toBytes()));
    return line;
  }

  private static String typeName(Object value) {
    if (value instanceof Integer) {
      return "Integer";
    }
    if (value instanceof Boolean) {
      return "Boolean";
    }
    if (value instanceof byte[]) {
      return "Binary";
    }
    if (value instanceof URI) {
      return "URI";
    }
    if (value instanceof OffsetDateTime) {
      return "Timestamp";
    }
    if (value instanceof String) {
      return "String";
    }
    return value.getClass().getName();
  }

  /** The CloudEvents canonical string of a value, as the Kafka binding carries it. */
  private static String text(Object value) {
    if (value instanceof OffsetDateTime time) {
      return time.format(DateTimeFormatter.ISO_OFFSET_DATE_TIME);
    }
    if (value instanceof byte[] bytes) {
      return Base64.getEncoder().encodeToString(bytes);
    }
    return value.toString();
  }
}

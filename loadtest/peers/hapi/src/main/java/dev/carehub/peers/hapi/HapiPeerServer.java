package dev.carehub.peers.hapi;

import ca.uhn.fhir.batch2.jobs.config.Batch2JobsConfig;
import ca.uhn.fhir.context.FhirContext;
import ca.uhn.fhir.jpa.api.config.JpaStorageSettings;
import ca.uhn.fhir.jpa.api.config.ThreadPoolFactoryConfig;
import ca.uhn.fhir.jpa.api.dao.IFhirSystemDao;
import ca.uhn.fhir.jpa.batch2.JpaBatch2Config;
import ca.uhn.fhir.jpa.binary.api.IBinaryStorageSvc;
import ca.uhn.fhir.jpa.binstore.DatabaseBinaryContentStorageSvcImpl;
import ca.uhn.fhir.jpa.config.HapiFhirLocalContainerEntityManagerFactoryBean;
import ca.uhn.fhir.jpa.config.HapiJpaConfig;
import ca.uhn.fhir.jpa.config.r4.JpaR4Config;
import ca.uhn.fhir.jpa.config.util.HapiEntityManagerFactoryUtil;
import ca.uhn.fhir.jpa.model.config.PartitionSettings;
import ca.uhn.fhir.jpa.model.config.SubscriptionSettings;
import ca.uhn.fhir.jpa.model.dialect.HapiFhirPostgresDialect;
import ca.uhn.fhir.jpa.model.entity.StorageSettings;
import ca.uhn.fhir.jpa.provider.JpaSystemProvider;
import ca.uhn.fhir.jpa.search.DatabaseBackedPagingProvider;
import ca.uhn.fhir.jpa.subscription.channel.config.SubscriptionChannelConfig;
import ca.uhn.fhir.narrative2.NullNarrativeGenerator;
import ca.uhn.fhir.rest.api.EncodingEnum;
import ca.uhn.fhir.rest.server.IncomingRequestAddressStrategy;
import ca.uhn.fhir.rest.server.RestfulServer;
import ca.uhn.fhir.rest.server.provider.ResourceProviderFactory;
import com.zaxxer.hikari.HikariConfig;
import com.zaxxer.hikari.HikariDataSource;
import jakarta.persistence.EntityManagerFactory;
import java.util.Map;
import javax.sql.DataSource;
import org.springframework.beans.factory.annotation.Value;
import org.springframework.beans.factory.config.ConfigurableListableBeanFactory;
import org.springframework.boot.SpringApplication;
import org.springframework.boot.autoconfigure.SpringBootApplication;
import org.springframework.boot.web.servlet.ServletRegistrationBean;
import org.springframework.context.annotation.Bean;
import org.springframework.context.annotation.Import;
import org.springframework.context.annotation.Lazy;
import org.springframework.context.annotation.Primary;
import org.springframework.orm.jpa.JpaTransactionManager;
import org.springframework.orm.jpa.LocalContainerEntityManagerFactoryBean;
import org.springframework.transaction.annotation.EnableTransactionManagement;

/**
 * A HAPI FHIR JPA server (R4, PostgreSQL) as HAPI's own configuration classes assemble it, for
 * loadtest/cmd/peerbench. What hapi-fhir-jpaserver-starter adds on top (its properties, the
 * tester UI, CQL, MDM, IPS, subscriptions, CORS, OpenAPI) is left out: the server answers FHIR
 * REST at /fhir with the JPA resource providers and the system provider (transaction and batch
 * Bundles POSTed to the base), with HAPI's defaults for storage (every built-in search
 * parameter indexed, referential integrity on write, history kept) and no request validation
 * (the starter's default too). Boot's own JPA, Flyway, Elasticsearch, batch and Quartz
 * auto-configuration is off (application.properties): HAPI brings its own.
 *
 * <p>Settings (system properties or the environment, as Spring reads them): peer.jdbc-url,
 * peer.jdbc-user, peer.pool-size (HikariCP, default 10 as the starter's), server.port and
 * server.address.
 */
@SpringBootApplication
@EnableTransactionManagement
@Import({
	JpaR4Config.class,
	HapiJpaConfig.class,
	JpaBatch2Config.class,
	Batch2JobsConfig.class,
	SubscriptionChannelConfig.class, // batch2's in-memory work channels (no subscription is processed)
	ThreadPoolFactoryConfig.class
})
public class HapiPeerServer {

	public static void main(String[] args) {
		SpringApplication.run(HapiPeerServer.class, args);
	}

	@Bean(destroyMethod = "close")
	public DataSource dataSource(
			@Value("${peer.jdbc-url}") String url,
			@Value("${peer.jdbc-user:postgres}") String user,
			@Value("${peer.pool-size:10}") int poolSize) {
		HikariConfig c = new HikariConfig();
		c.setJdbcUrl(url);
		c.setUsername(user);
		c.setMaximumPoolSize(poolSize);
		c.setPoolName("hapi");
		return new HikariDataSource(c);
	}

	/** HAPI's storage defaults; only what differs from new JpaStorageSettings() is set. */
	@Bean
	public JpaStorageSettings storageSettings() {
		JpaStorageSettings s = new JpaStorageSettings();
		s.setIndexMissingFields(StorageSettings.IndexEnabledEnum.DISABLED); // the default, said out loud
		s.setAllowExternalReferences(false);
		s.setHibernateSearchIndexSearchParams(false); // no Lucene/Elasticsearch
		s.setHibernateSearchIndexSearchParams(false); // no Lucene/Elasticsearch
		s.setStoreResourceInHSearchIndex(false);
		s.setAdvancedHSearchIndexing(false);
		return s;
	}

	@Bean
	public PartitionSettings partitionSettings() {
		return new PartitionSettings();
	}

	@Bean
	public SubscriptionSettings subscriptionSettings() {
		return new SubscriptionSettings();
	}

	@Primary
	@Bean
	public LocalContainerEntityManagerFactoryBean entityManagerFactory(
			DataSource dataSource,
			ConfigurableListableBeanFactory beanFactory,
			FhirContext fhirContext,
			JpaStorageSettings storageSettings) {
		LocalContainerEntityManagerFactoryBean f =
				HapiEntityManagerFactoryUtil.newEntityManagerFactory(beanFactory, fhirContext, storageSettings);
		f.setPersistenceUnitName("HAPI_PU");
		f.setDataSource(dataSource);
		// HAPI's own Hibernate defaults, then the starter's choices for a server of its own.
		Map<String, Object> p = new HapiFhirLocalContainerEntityManagerFactoryBean(beanFactory).getJpaPropertyMap();
		p.putAll(f.getJpaPropertyMap());
		p.put("hibernate.dialect", HapiFhirPostgresDialect.class.getName());
		p.put("hibernate.hbm2ddl.auto", "update");
		p.put("hibernate.format_sql", "false");
		p.put("hibernate.show_sql", "false");
		p.put("hibernate.jdbc.batch_size", "20");
		p.put("hibernate.cache.use_query_cache", "false");
		p.put("hibernate.cache.use_second_level_cache", "false");
		p.put("hibernate.cache.use_structured_entries", "false");
		p.put("hibernate.cache.use_minimal_puts", "false");
		p.put("hibernate.search.enabled", "false");
		p.put("hibernate.archive.scanner", "org.hibernate.boot.archive.scan.internal.DisabledScanner");
		f.setJpaPropertyMap(p);
		return f;
	}

	@Primary
	@Bean
	public JpaTransactionManager transactionManager(EntityManagerFactory emf) {
		JpaTransactionManager t = new JpaTransactionManager();
		t.setEntityManagerFactory(emf);
		return t;
	}

	@Lazy
	@Bean
	public IBinaryStorageSvc binaryStorageSvc() {
		return new DatabaseBinaryContentStorageSvcImpl();
	}

	@Bean
	public RestfulServer restfulServer(
			IFhirSystemDao<?, ?> systemDao,
			ResourceProviderFactory resourceProviders,
			JpaSystemProvider<?, ?> systemProvider,
			DatabaseBackedPagingProvider pagingProvider) {
		FhirContext ctx = systemDao.getContext();
		ctx.setNarrativeGenerator(new NullNarrativeGenerator()); // the starter's default (narratives off)
		RestfulServer s = new RestfulServer(ctx);
		s.registerProviders(resourceProviders.createProviders());
		s.registerProvider(systemProvider);
		s.setPagingProvider(pagingProvider);
		s.setDefaultResponseEncoding(EncodingEnum.JSON);
		s.setDefaultPrettyPrint(false);
		s.setServerAddressStrategy(new IncomingRequestAddressStrategy());
		return s;
	}

	@Bean
	public ServletRegistrationBean<RestfulServer> fhirServlet(RestfulServer server) {
		ServletRegistrationBean<RestfulServer> r = new ServletRegistrationBean<>(server, "/fhir/*");
		r.setLoadOnStartup(1);
		return r;
	}
}
